"""One ES step over the population, owned by one object: blocks of directions, their noise, the forward
passes, the exchange between processes, and the update.

Directions are cut into blocks in one place (:class:`PopulationStep`): the forward runs over this process's
share of the directions in blocks of ``chunk``; the update runs over all directions (every process computes
the same update) in blocks whose noise is drawn again where a later block replaced it.
"""

from __future__ import annotations

import os
import sys

import torch

from ..model import PerturbedModel, direction_blocks
from ..noise import BLOCK
from ..strategies import Strategy
from .config import PRECISIONS
from .distributed import Ranks
from .precision import slow_precision_note


def _out_of_memory(error: BaseException) -> bool:
    """CUDA (and other accelerators) raise OutOfMemoryError; the CPU allocator raises a RuntimeError."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(error)


def free_memory(device: torch.device) -> int | None:
    """Bytes the device can still allocate (CPU: MemAvailable of /proc/meminfo), or None where unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu" and sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


class PopulationStep:
    """Runs ES steps of ``strategy`` on ``task``: this process's share of the directions is evaluated in
    blocks, the fitness of all processes is gathered, and the strategy updates the model.

    Args:
        chunk: directions per block: an int, "auto" (the largest block whose noise fits in half the free
            memory, halved on out-of-memory with the step kept), or None (the whole share at once).
        precision: "fp32", "bf16" or "fp16" (the forward under autocast).

    A population whose noise cannot fit even in blocks of one direction (or, with a fixed chunk, in blocks
    of that size) is refused when this is built, with the memory it would need.
    """

    def __init__(self, task, pm: PerturbedModel, strategy: Strategy, ranks: Ranks | None = None, chunk=None,
                 precision: str = "fp32", log=print):
        self.task, self.pm, self.strategy, self.log = task, pm, strategy, log
        self.ranks = ranks or Ranks()
        self.share = self.ranks.share(pm.directions)
        if chunk is not None and chunk != "auto" and not (isinstance(chunk, int) and 1 <= chunk <= pm.directions):
            raise ValueError(f"chunk must be None, 'auto' or a number of directions in [1, {pm.directions}]; "
                             f"got {chunk!r}")
        if isinstance(chunk, int) and self.ranks.distributed and len(self.share) % chunk:
            raise ValueError(f"chunk_size {chunk} must divide each process's {len(self.share)} directions")
        self.auto = chunk == "auto"
        self.chunk = len(self.share) if chunk in (None, "auto") else min(chunk, len(self.share))
        # the update's blocks: a fixed chunk; under torchrun each process's share (so a one-process run with
        # the share as its chunk makes the same computations, and ends bit-identical); else the forward's
        self.update_chunk = chunk if isinstance(chunk, int) else (len(self.share) if self.ranks.distributed
                                                                   else None)
        device = next(pm.model.parameters()).device
        self._check_memory(device)
        dtype = getattr(torch, PRECISIONS[precision]) if PRECISIONS[precision] else None
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else None
        note = slow_precision_note(device, dtype) if dtype else None
        if note:
            log(note)

    # ----- blocks ------------------------------------------------------------------------------------
    def forward_blocks(self) -> list[range]:
        """This process's directions, in the blocks the forward runs."""
        return direction_blocks(self.share, self.chunk)

    def update_blocks(self) -> list[range]:
        """All directions, in the blocks the update runs."""
        return direction_blocks(range(self.pm.directions), self.update_chunk or self.chunk)

    # ----- memory ------------------------------------------------------------------------------------
    def _check_memory(self, device: torch.device) -> None:
        """Refuse up front a population whose noise cannot fit; with "auto", start at the largest block
        whose noise fits in half the free memory (the other half for activations)."""
        free = free_memory(device)
        if os.environ.get("NESGPU_FREE_MEMORY"):  # tests and users may state the budget
            try:
                free = int(float(os.environ["NESGPU_FREE_MEMORY"]))
            except ValueError:
                raise ValueError(f"NESGPU_FREE_MEMORY must be a number of bytes; got "
                                 f"{os.environ['NESGPU_FREE_MEMORY']!r}") from None
        if free is None:
            return
        try:
            shared, per_direction = self.noise_bytes_per_direction()
        except RuntimeError as e:
            if not _out_of_memory(e):
                raise
            raise ValueError(f"the noise of one block of {BLOCK} directions does not fit in {device}'s memory "
                             f"({_gib(free)} free); the model is too large for this device (or use a kind with "
                             f"less noise, e.g. --layer lowrank)") from None
        if not per_direction:
            return
        # a block is drawn whole (BLOCK directions) before it is sliced: the peak is one block more
        need = shared + per_direction * ((1 if self.auto else self.chunk) + BLOCK)
        if need > free:
            what = "one direction" if self.auto else f"a block of {self.chunk} directions"
            hint = ("the model is too large for this device" if self.auto or self.chunk == 1
                    else "use --chunk-size auto or a smaller --chunk-size")
            raise ValueError(f"the noise of {what} needs {_gib(need)}, but {device} has {_gib(free)} free; {hint} "
                             f"(or a kind with less noise, e.g. --layer lowrank)")
        if self.auto:
            fits = max(1, int((free // 2 - shared) // per_direction) - BLOCK)
            if fits < self.chunk:
                self.chunk = fits
                self.log(f"chunk size {fits}: the noise of {fits} directions ({_gib(fits * per_direction)}) fits in "
                         f"half of the {_gib(free)} free on {device}")

    def noise_bytes_per_direction(self) -> tuple[int, int]:
        """(bytes of the noise every direction shares, bytes one more direction costs), measured by drawing
        one and two directions."""
        if len(self.share) < 2:
            return 0, 0
        step, start = self.strategy.step + 1, self.share.start
        try:
            self.pm.set_noise(step=step, directions=range(start, start + 1))
            one = self.pm.noise_bytes()
            self.pm.set_noise(step=step, directions=range(start, start + 2))
            two = self.pm.noise_bytes()
        finally:
            self.pm.free_memory()
        per_direction = max(0, two - one)
        return max(0, one - per_direction), per_direction

    # ----- the step ----------------------------------------------------------------------------------
    def run(self) -> dict:
        """One ES step: the population's fitness, then the update; returns the strategy's statistics (the
        step's one read from the device) and the task's scalar statistics."""
        step = self.strategy.begin_step()
        fitness, info = self.evaluate(step)
        scalars = {k: v for k, v in info.items() if torch.as_tensor(v).dim() == 0}
        return self.strategy.tell(fitness, extra=scalars, blocks=self.update_blocks())

    def evaluate(self, step: int) -> tuple[torch.Tensor, dict]:
        """Fitness (R, D) of the whole population at ``step`` (every process's), and the step's statistics."""
        while True:
            try:
                return self._evaluate(step)
            except RuntimeError as e:  # torch.OutOfMemoryError is one too
                if not _out_of_memory(e) or not self.auto or self.chunk == 1:
                    raise
                self.pm.free_memory()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                self.chunk = max(1, self.chunk // 2)
                self.log(f"out of memory at step {step}: retrying the step with chunk size {self.chunk}")

    def _evaluate(self, step: int) -> tuple[torch.Tensor, dict]:
        parts, infos = [], []
        for block in self.forward_blocks():
            if not self.pm.has_noise(step, block):
                self.pm.set_noise(step=step, directions=block)
            if self.autocast is None:
                fitness, info = self.task.fitness(self.pm, step)
            else:
                with self.autocast():
                    fitness, info = self.task.fitness(self.pm, step)
            parts.append(fitness.to(torch.float32 if fitness.dtype in (torch.bfloat16, torch.float16)
                                    else fitness.dtype))
            infos.append((len(block), info))
        try:
            fitness, info = self.ranks.exchange(torch.cat(parts, dim=1), self._block_totals(infos))
        except RuntimeError as e:
            raise RuntimeError(f"rank {self.ranks.rank}: exchanging fitness at step {step} failed; another "
                               f"process died or hung ({e})") from e
        summed = self.task.summed_info
        info = {k: v if k in summed else v / self.pm.directions for k, v in info.items()}
        self.task.finish_step(self.pm, info)
        return fitness, info

    def _block_totals(self, infos: list[tuple[int, dict]]) -> dict:
        """This process's step statistics from its blocks: the task's summed ones added, the others weighted
        by the block's directions (divided by the population once the processes' totals are added)."""
        totals = {}
        for key in infos[0][1]:
            if key in self.task.summed_info:
                totals[key] = sum(info[key] for _, info in infos)
            else:
                totals[key] = sum(size * torch.as_tensor(info[key], dtype=torch.float64) for size, info in infos)
        return totals


__all__ = ["PopulationStep", "free_memory"]
