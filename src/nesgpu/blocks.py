"""The blocks a step's directions are evaluated and updated in: a fixed chunk, or "auto", the largest block
whose noise (and the task's activations) fits in half the free memory, halved on out-of-memory.

A population whose noise cannot fit even in blocks of one direction (or, with a fixed chunk, in blocks of that
size) is refused when the blocks are sized, with the memory it would need.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .memory import free_memory, gib, out_of_memory
from .model import PerturbedModel, direction_blocks
from .noise import BLOCK


@runtime_checkable
class CountsActivations(Protocol):
    """A task that states the memory its forward needs per direction beyond the noise (a generation task:
    the KV cache of that direction's rows), which chunk "auto" counts when it sizes the blocks."""

    def activation_bytes(self, pm: PerturbedModel) -> int:
        """Bytes the rows of one direction (both signs) take during the task's forward."""
        ...


class Blocks:
    """This process's ``share`` of the directions of ``pm`` in forward blocks of ``chunk`` (an int, "auto" or
    None: the whole share), and all directions in update blocks: a fixed chunk; under torchrun each process's
    share (so a one-process run with the share as its chunk makes the same computations, and ends
    bit-identical); else the forward's."""

    def __init__(self, pm: PerturbedModel, share: range, distributed: bool, chunk=None, log=print,
                 first_chunk: int | None = None):
        if chunk is not None and chunk != "auto" and not (isinstance(chunk, int) and 1 <= chunk <= pm.directions):
            raise ValueError(f"chunk must be None, 'auto' or a number of directions in [1, {pm.directions}]; "
                             f"got {chunk!r}")
        if isinstance(chunk, int) and distributed and len(share) % chunk:
            raise ValueError(f"chunk_size {chunk} must divide each process's {len(share)} directions")
        self.pm, self.share, self.log = pm, share, log
        self.auto = chunk == "auto"
        self.chunk = len(share) if chunk in (None, "auto") else min(chunk, len(share))
        if self.auto and first_chunk:  # a memory plan's block (nesgpu.train.setup.memory_plan)
            self.chunk = max(1, min(self.chunk, first_chunk))
        self.update_chunk = chunk if isinstance(chunk, int) else (len(share) if distributed else None)
        self.noise_sizes = (0, 0)  # (bytes all directions share, bytes per direction), once measured
        self.sized = not self.auto  # whether "auto" has counted the task's activations

    def forward_blocks(self) -> list[range]:
        """This process's directions, in the blocks the forward runs."""
        return direction_blocks(self.share, self.chunk)

    def update_blocks(self) -> list[range]:
        """All directions, in the blocks the update runs."""
        return direction_blocks(range(self.pm.directions), self.update_chunk or self.chunk)

    def halve(self) -> bool:
        """After an out-of-memory error: with "auto", halve the chunk (True); else nothing to do (False)."""
        if not self.auto or self.chunk == 1:
            return False
        self.chunk = max(1, self.chunk // 2)
        return True

    def check_memory(self, device: torch.device) -> None:
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
                             f"({gib(free)} free); the model is too large for this device (or use a kind with "
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
            raise ValueError(f"the noise of {what} needs {gib(need)}, but {device} has {gib(free)} free; {hint} "
                             f"(or a kind with less noise, e.g. --layer lowrank)")
        if self.auto:
            fits = max(1, int((free // 2 - shared) // per_direction) - BLOCK)
            if fits < self.chunk:
                self.chunk = fits
                self.log(f"chunk size {fits}: the noise of {fits} directions ({gib(fits * per_direction)}) fits in "
                         f"half of the {gib(free)} free on {device}")

    def size_for(self, task, device: torch.device) -> None:
        """Chunk "auto" with a task that counts its activations (:class:`CountsActivations`): the largest block
        whose noise and activations fit in half the free memory, if smaller than the noise alone allowed."""
        self.sized = True
        free = free_memory(device) if isinstance(task, CountsActivations) else None
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
                     f"({gib(fits * (noise + activations))}, {gib(fits * activations)} of it the task's, e.g. the "
                     f"KV cache) fit in half of the {gib(free)} free on {device}")

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


__all__ = ["Blocks", "CountsActivations"]
