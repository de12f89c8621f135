"""The one owner of a step's directions: blocks, their noise, the forward passes, the exchange between
processes, and the update. Nothing else calls ``PerturbedModel.set_noise`` or ``PerturbedModel.update``.

The forward runs over this process's share of the directions (:class:`~nesgpu.distributed.Ranks`) in blocks
of ``chunk``; the update runs over all directions (every process computes the same update) in blocks whose
noise is drawn again where a later block replaced it.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from .distributed import Ranks
from .layers.guard import NeedsFallback
from .model import PerturbedModel, direction_blocks
from .noise import BLOCK
from .precision import autocast_dtype, slow_precision_note


@runtime_checkable
class ShapesFitness(Protocol):
    """A task that shapes the whole population's fitness (R, D) once it is gathered from every block and
    process, before the strategy sees it: e.g. per-prompt normalisation of a generation task's rewards."""

    def shape(self, fitness: torch.Tensor) -> torch.Tensor:
        """The shaped fitness, of the same shape."""
        ...


@runtime_checkable
class CountsActivations(Protocol):
    """A task that states the memory its forward needs per direction beyond the noise (a generation task:
    the KV cache of that direction's rows), which chunk "auto" counts when it sizes the blocks."""

    def activation_bytes(self, pm: PerturbedModel) -> int:
        """Bytes the rows of one direction (both signs) take during the task's forward."""
        ...


class Evaluation(NamedTuple):
    """What one step's population gives back, gathered over every process."""

    fitness: torch.Tensor  # (R, D), higher is better
    sq_norms: torch.Tensor | None  # (D,) ||z_d||^2 when asked for, else None
    info: dict  # the task's step statistics, merged over blocks and processes


def out_of_memory(error: BaseException) -> bool:
    """CUDA (and other accelerators) raise OutOfMemoryError; the CPU allocator raises a RuntimeError."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(error)


def free_memory(device: torch.device) -> int | None:
    """Bytes the device can still allocate (CPU: MemAvailable of /proc/meminfo), or None where unknown;
    the environment variable NESGPU_FREE_MEMORY (bytes) states it instead."""
    if os.environ.get("NESGPU_FREE_MEMORY"):
        try:
            return int(float(os.environ["NESGPU_FREE_MEMORY"]))
        except ValueError:
            raise ValueError(f"NESGPU_FREE_MEMORY must be a number of bytes; got "
                             f"{os.environ['NESGPU_FREE_MEMORY']!r}") from None
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


class Population:
    """Evaluates and updates the population of ``pm``, block by block, over the processes of ``ranks``.

    Args:
        chunk: directions per block: an int, "auto" (the largest block whose noise fits in half the free
            memory, halved on out-of-memory with the step kept), or None (the whole share at once).
        precision: "fp32", "bf16" or "fp16" (the forward under autocast).

    A population whose noise cannot fit even in blocks of one direction (or, with a fixed chunk, in blocks
    of that size) is refused when this is built, with the memory it would need.
    """

    def __init__(self, pm: PerturbedModel, ranks: Ranks | None = None, chunk=None, precision: str = "fp32",
                 log=print):
        if not isinstance(pm, PerturbedModel):
            raise TypeError(f"pm must be a PerturbedModel; got {type(pm).__name__}")
        self.pm, self.log = pm, log
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
        self.step = 0  # the step last evaluated, whose noise the update uses
        self.device = device = next(pm.model.parameters()).device
        self.noise_sizes = (0, 0)  # (bytes all directions share, bytes per direction), once measured
        self._sized = not self.auto  # whether "auto" has counted the task's activations
        self._check_memory(device)
        dtype = autocast_dtype(precision)
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else None
        note = slow_precision_note(device, dtype) if dtype else None
        if note:
            log(note)

    @property
    def directions(self) -> int:
        return self.pm.directions

    def parameters(self) -> list[torch.nn.Parameter]:
        """The model's parameters in its own order (an optimizer's state is saved by that order), each
        half-precision one replaced by its float32 master: what the update writes ``.grad`` into."""
        perturbed = [p for layer in self.pm.layers.values() for p in layer.perturbed_parameters().values()]
        masters = {id(p): value for p, value in zip(perturbed, self.pm.parameters())}
        return [masters.get(id(p), p) for p in self.pm.model.parameters()]

    def free_memory(self) -> None:
        self.pm.free_memory()

    # ----- blocks ------------------------------------------------------------------------------------
    def forward_blocks(self) -> list[range]:
        """This process's directions, in the blocks the forward runs."""
        return direction_blocks(self.share, self.chunk)

    def update_blocks(self) -> list[range]:
        """All directions, in the blocks the update runs."""
        return direction_blocks(range(self.pm.directions), self.update_chunk or self.chunk)

    def _draw(self, step: int, block: range, sigma: float) -> None:
        self.pm.sigma = sigma  # the strategy's, for this step: the only writer of pm.sigma in a run
        if not self.pm.has_noise(step, block):
            self.pm.set_noise(step=step, directions=block)

    # ----- the step ----------------------------------------------------------------------------------
    def evaluate(self, task, step: int, sigma: float, sq_norms: bool = False) -> Evaluation:
        """Fitness (R, D) of the whole population at ``step`` with noise scale ``sigma`` (every process's),
        ||z_d||^2 when ``sq_norms``, and the step's statistics. With chunk "auto", an out-of-memory error
        halves the chunk and evaluates the step again."""
        if not self._sized:
            self._size_for(task)
        while True:  # each fallback takes more of the model, so it ends (fall_back refuses a second time)
            try:
                return self._evaluate(task, step, sigma, sq_norms)
            except NeedsFallback as e:  # a module exact only in the fallback (once per module, at the first call)
                self.pm.fall_back(e)
            except RuntimeError as e:  # torch.OutOfMemoryError is one too
                if not out_of_memory(e) or not self.auto or self.chunk == 1:
                    raise
                self.pm.free_memory()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                self.chunk = max(1, self.chunk // 2)
                self.log(f"out of memory at step {step}: retrying the step with chunk size {self.chunk}")

    def _evaluate(self, task, step: int, sigma: float, sq_norms: bool) -> Evaluation:
        parts, norms, totals = [], [], _BlockTotals(task.summed_info)
        for block in self.forward_blocks():
            self._draw(step, block, sigma)
            if self.autocast is None:
                fitness, info = task.fitness(self.pm, step)
            else:
                with self.autocast():
                    fitness, info = task.fitness(self.pm, step)
            parts.append(fitness.to(torch.float32 if fitness.dtype in (torch.bfloat16, torch.float16)
                                    else fitness.dtype))
            if sq_norms:
                norms.append(self.pm.noise_sq_norms())
            totals.add(len(block), info)
        self.step = step
        local = totals.values()
        if sq_norms:  # zero elsewhere, so that the exchange's sum over processes places each share (exactly)
            local["__sq_norms__"] = torch.cat(norms)
            if self.ranks.distributed:
                padded = local["__sq_norms__"].new_zeros(self.pm.directions)
                padded[self.share.start:self.share.stop] = local["__sq_norms__"]
                local["__sq_norms__"] = padded
        try:
            fitness, info = self.ranks.exchange(torch.cat(parts, dim=1), local)
        except RuntimeError as e:
            raise RuntimeError(f"rank {self.ranks.rank}: exchanging fitness at step {step} failed; another "
                               f"process died or hung ({e})") from e
        norms = info.pop("__sq_norms__", None)
        info = {k: v if k in task.summed_info else v / self.pm.directions for k, v in info.items()}
        task.finish_step(self.pm, info)
        if isinstance(task, ShapesFitness):  # over the whole population, the same in every process
            fitness = task.shape(fitness)
        return Evaluation(fitness, norms, info)

    def update(self, weights: torch.Tensor, sigma: float) -> None:
        """Add the ES estimate of the last evaluated step, with ``weights`` (R, D) or (D,) over all
        directions (lower is better), to ``.grad``: block by block, each block's noise drawn again where
        another one replaced it."""
        for block in self.update_blocks():
            self._draw(self.step, block, sigma)
            self.pm.update(weights[..., block.start:block.stop])

    # ----- memory ------------------------------------------------------------------------------------
    def _check_memory(self, device: torch.device) -> None:
        """Refuse up front a population whose noise cannot fit; with "auto", start at the largest block
        whose noise fits in half the free memory (the other half for activations)."""
        free = free_memory(device)
        if free is None:
            return
        try:
            shared, per_direction = self.noise_bytes_per_direction()
        except RuntimeError as e:
            if not out_of_memory(e):
                raise
            raise ValueError(f"the noise of one block of {BLOCK} directions does not fit in {device}'s memory "
                             f"({_gib(free)} free); the model is too large for this device (or use a kind with "
                             f"less noise, e.g. --layer lowrank)") from None
        self.noise_sizes = (shared, per_direction)
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

    def _size_for(self, task) -> None:
        """Chunk "auto" with a task that counts its activations (:class:`CountsActivations`): the largest block
        whose noise and activations fit in half the free memory, if smaller than the noise alone allowed."""
        self._sized = True
        free = free_memory(self.device) if isinstance(task, CountsActivations) else None
        if free is None:
            return
        shared, noise = self.noise_sizes
        activations = int(task.activation_bytes(self.pm))
        if noise + activations <= 0:
            return
        fits = max(1, int((free // 2 - shared - BLOCK * noise) // (noise + activations)))
        if fits < self.chunk:
            self.chunk = fits
            self.log(f"chunk size {fits}: the noise and activations of {fits} directions "
                     f"({_gib(fits * (noise + activations))}, {_gib(fits * activations)} of it the task's, e.g. the "
                     f"KV cache) fit in half of the {_gib(free)} free on {self.device}")

    def noise_bytes_per_direction(self) -> tuple[int, int]:
        """(bytes of the noise every direction shares, bytes one more direction costs), measured by drawing
        one and two directions."""
        if len(self.share) < 2:
            return 0, 0
        step, start = self.pm.step + 1, self.share.start
        try:
            self.pm.set_noise(step=step, directions=range(start, start + 1))
            one = self.pm.noise_bytes()
            self.pm.set_noise(step=step, directions=range(start, start + 2))
            two = self.pm.noise_bytes()
        finally:
            self.pm.free_memory()
        per_direction = max(0, two - one)
        return max(0, one - per_direction), per_direction


class _BlockTotals:
    """This process's step statistics from its blocks: the task's summed ones added, the others weighted by
    the block's directions (divided by the population once the processes' totals are added)."""

    def __init__(self, summed: frozenset[str]):
        self.summed, self.totals = summed, {}

    def add(self, size: int, info: dict) -> None:
        for key, value in info.items():
            part = value if key in self.summed else size * torch.as_tensor(value, dtype=torch.float64)
            self.totals[key] = part if key not in self.totals else self.totals[key] + part

    def values(self) -> dict:
        return dict(self.totals)


__all__ = ["CountsActivations", "Evaluation", "Population", "ShapesFitness", "free_memory", "out_of_memory"]
