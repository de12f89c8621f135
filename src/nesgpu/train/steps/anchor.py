"""The starting model of a run, kept where something needs it: ``--anchor`` pulls the evolving weights back toward
it after every step, and a language-model task measures how far the model has moved from it (``kl``, the change
of ``drift_nll``).

``--anchor``: after every optimizer step, ``w -= anchor * (w - w_start)``, which bounds how far an ES run drifts
from the model it started from (the "anchored weight decay" of the comparisons of ES with GRPO). The pull is
applied once per step, after every block's update, so a chunked run pulls as an unchunked one.

Only the evolving (trainable) parameters are kept, once, on their device and in their own dtype (a LoRA run keeps
its adapters, not the base model), and in the checkpoint, so that a resumed run pulls toward, and measures from,
the same model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

SWAP_SLICE = 1 << 22  # entries exchanged at a time by loaded(): its buffer holds at most 4M entries


class StartingWeights:
    """The starting values of ``model``'s trainable parameters.

    Args:
        model: the model whose weights are evaluated (a half-precision model's own weights, not the masters).
        parameters: what the optimizer steps, in ``model.parameters()``'s order (a half-precision parameter's
            float32 master in its place): the anchor pulls these.
    """

    def __init__(self, model: nn.Module, parameters: list[torch.Tensor]):
        named = list(model.named_parameters())
        if len(named) != len(parameters):
            raise ValueError(f"parameters must follow model.parameters(): {len(named)} of the model, got "
                             f"{len(parameters)}")
        self.entries = [(name, p, stepped) for (name, p), stepped in zip(named, parameters) if p.requires_grad]
        self.order = [name for name, _ in named]  # every parameter's name (the first --anchor checkpoints' layout)
        self.start = {name: p.detach().clone() for name, p, _ in self.entries}
        self._exchange: dict = {}  # (dtype, device) -> the buffer loaded() exchanges values through

    @torch.no_grad()
    def pull(self, strength: float) -> None:
        """``w -= strength * (w - w_start)`` for every stepped parameter, in place (no host read)."""
        for name, _, stepped in self.entries:
            stepped.sub_(stepped - self.start[name], alpha=strength)

    @contextlib.contextmanager
    def loaded(self) -> Iterator[None]:
        """Inside, the model's trainable weights are the starting ones; after, as they were, also when the body
        raises. The values are exchanged in place, through a small buffer made once, so a compiled graph keeps
        its addresses and the way back allocates nothing (it cannot run out of memory after the body did)."""
        swapped = 0  # the entries swapped in so far (all of them, unless a swap failed)
        try:
            with torch.no_grad():
                for name, p, _ in self.entries:
                    self._swap(p, self.start[name])
                    swapped += 1
            yield
        finally:
            with torch.no_grad():
                for name, p, _ in self.entries[:swapped]:
                    self._swap(p, self.start[name])

    def _swap(self, p: torch.Tensor, other: torch.Tensor) -> None:
        """Exchange the values of ``p`` and ``other`` (one shape, dtype and device), slice by slice through the
        buffer of their dtype and device."""
        if not (p.is_contiguous() and other.is_contiguous()):  # a strided view: a copy of it, as a last resort
            held = p.detach().clone()
            p.copy_(other)
            other.copy_(held)
            return
        key = (p.dtype, p.device)
        if key not in self._exchange:
            largest = max(q.numel() for _, q, _ in self.entries if (q.dtype, q.device) == key)
            self._exchange[key] = torch.empty(min(largest, SWAP_SLICE), dtype=p.dtype, device=p.device)
        buffer, flat, kept = self._exchange[key], p.detach().view(-1), other.view(-1)
        for start in range(0, flat.numel(), buffer.numel()):
            part = slice(start, min(start + buffer.numel(), flat.numel()))
            held = buffer[:part.stop - part.start]
            held.copy_(flat[part])
            flat[part].copy_(kept[part])
            kept[part].copy_(held)

    def state(self) -> dict:
        """What a checkpoint keeps: the starting weights by parameter name."""
        return {"start": dict(self.start)}

    def load(self, state: dict) -> bool:
        """The starting weights a checkpoint kept (under ``start``, or under ``anchor`` as the first runs with
        --anchor kept every parameter in order); False where it holds none (nothing changes then)."""
        saved = state.get("start")
        if saved is None and isinstance(state.get("anchor"), list):
            old = state["anchor"]
            saved = dict(zip(self.order, old)) if len(self.order) == len(old) else None
        if not isinstance(saved, dict) or not set(self.start) <= set(saved):
            return False
        self.start = {name: saved[name].to(device=p.device, dtype=p.dtype) for name, p, _ in self.entries}
        return True


__all__ = ["StartingWeights"]
