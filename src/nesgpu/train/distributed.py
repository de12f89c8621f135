"""Multi-process runs through torch.distributed, launched by torchrun (the OpenAI-ES design).

Ranks evaluate disjoint blocks of directions and exchange only fitness values, with the step's few summed
statistics (loss, observation sums), in one all_gather per step; every rank then computes the same update
from the same seeds, so no parameters or noise cross the wire. Gloo on CPU, NCCL on GPU; multi-node through
torchrun's rendezvous. Collectives time out after ``timeout_s``, so a rank that dies or hangs ends the job
with an error instead of a silent stall.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class Ranks:
    """This process's place in the job: rank r of world w (1 process: rank 0 of 1)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def share(self, directions: int) -> range:
        """The block of directions this rank evaluates."""
        if directions % self.world:
            raise ValueError(f"{directions} directions do not split evenly over {self.world} processes; "
                             f"choose a population whose directions are a multiple of the world size")
        size = directions // self.world
        return range(self.rank * size, (self.rank + 1) * size)

    def exchange(self, fitness: torch.Tensor, totals: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """The step's one collective: fitness (..., D / world) of every rank, concatenated in rank order
        along the last dimension, and each tensor of ``totals`` summed over the ranks.

        Both travel in one float64 all_gather (exact for float32 fitness and for counts below 2**53) and
        come back in their own dtypes and shapes. Alone, returns its arguments.
        """
        if not self.distributed:
            return fitness, totals
        values = {k: torch.as_tensor(v, device=fitness.device) for k, v in totals.items()}
        flat = torch.cat([fitness.reshape(-1).double(), *(v.reshape(-1).double() for v in values.values())])
        parts = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(parts, flat)
        n = fitness.numel()
        gathered = torch.cat([part[:n].view(fitness.shape) for part in parts], dim=-1).to(fitness.dtype)
        summed = parts[0][n:]
        for part in parts[1:]:  # in rank order, as one process adds its blocks
            summed = summed + part[n:]
        out, offset = {}, 0
        for key, v in values.items():
            out[key] = summed[offset : offset + v.numel()].view(v.shape).to(v.dtype)
            offset += v.numel()
        return gathered, out


def init_from_environment(device: torch.device, timeout_s: float = 300.0) -> Ranks:
    """Join the process group torchrun describes in the environment (WORLD_SIZE > 1), else run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
