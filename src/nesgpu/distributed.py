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
    group: object = None  # the ranks' own process group (None: torch.distributed's default group)

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

    def exchange(self, fitness: torch.Tensor, totals: dict) -> tuple[torch.Tensor, dict]:
        """The step's one collective: fitness (..., D / world) of every rank, concatenated in rank order
        along the last dimension, and each of ``totals`` (tensors or numbers) summed over the ranks.

        Both travel in one float64 all_gather, exact for float32/float64 values and for integers below
        2**53. Each rank's totals are cast back to their own dtype and added in rank order, as one process
        adds its blocks, so N ranks give what one process gives with N blocks. Alone, returns its arguments.
        """
        if not self.distributed:
            return fitness, totals
        values = {k: _as_tensor(v, fitness.device) for k, v in totals.items()}
        flat = torch.cat([fitness.reshape(-1).double(), *(v.reshape(-1).double() for v in values.values())])
        if self.group is not None:  # a gloo group of our own: the values travel on the host
            flat = flat.cpu()
        parts = [torch.empty_like(flat) for _ in range(self.world)]
        dist.all_gather(parts, flat, group=self.group)
        parts = [part.to(fitness.device) for part in parts]
        n = fitness.numel()
        gathered = torch.cat([part[:n].view(fitness.shape) for part in parts], dim=-1).to(fitness.dtype)
        out, offset = {}, n
        for key, v in values.items():
            rank_values = [part[offset : offset + v.numel()].view(v.shape).to(v.dtype) for part in parts]
            out[key] = rank_values[0]
            for value in rank_values[1:]:
                out[key] = out[key] + value
            offset += v.numel()
        return gathered, out

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a tensor over the ranks (alone: the tensor)."""
        if not self.distributed:
            return value
        held = value.detach().to("cpu", copy=True) if self.group is not None else value.clone()
        dist.all_reduce(held, group=self.group)
        return held.to(value.device) / self.world

    def barrier(self) -> None:
        """Wait for every rank (alone: return)."""
        if self.distributed:
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Leave the ranks' process group (the default group, unless the ranks have one of their own, which is
        dropped: the default one is then an in-process engine's)."""
        if self.group is None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self.group = None


def _as_tensor(value, device: torch.device) -> torch.Tensor:
    """A total as a tensor; Python numbers keep full precision (float64 / int64)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return torch.as_tensor(value, dtype=torch.float64 if isinstance(value, float) else None, device=device)


def init_from_environment(device: torch.device, timeout_s: float = 300.0, own_group: bool = False) -> Ranks:
    """Join the process group torchrun describes in the environment (WORLD_SIZE > 1), else run alone. With
    ``own_group``, the ranks make a gloo group of their own from torchrun's store and leave torch.distributed's
    default group alone: an engine in the process (vLLM's, world size 1) makes that one its own."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    if own_group:
        return _own_group(world, timedelta(seconds=timeout_s))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def _own_group(world: int, timeout: timedelta) -> Ranks:
    """The ranks' gloo group, from the store torchrun's agent hosts (else rank 0's) under a prefix of ours."""
    rank = int(os.environ["RANK"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent and rank == 0, timeout=timeout)
    group = dist.ProcessGroupGloo(dist.PrefixStore("nesgpu_ranks", store), rank, world, timeout)
    return Ranks(rank, world, int(os.environ.get("LOCAL_RANK", "0")), group)
