"""The ES estimate of one perturbed module, ``sum_d coef_d z_d`` per parameter (the noise as evaluated), taken
two ways:

- :func:`accumulate_grad` adds it to ``.grad`` (or a float32 master's), for a ``torch.optim`` optimizer to step;
- :func:`apply_update` steps the weights themselves by a :class:`Rule` (plain SGD, Adam), in place (seed
  replay: no ``.grad``, no master). A
  matrix whose kind gives its estimate by rows (low-rank: a sum of D outer products) is written in slices of
  :data:`SLICE` entries, so the workspace stays a few slices however large the matrix (a 151,936-row tied
  embedding); any other parameter's estimate is one temporary of its size. A half-precision weight takes the sum
  by stochastic rounding (:func:`nesgpu.rounding.stochastic_round_`), from a generator per parameter that the
  caller seeds, so the result is the same wherever and however the directions were evaluated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..rounding import stochastic_round_
from .drawing import HALF

SLICE = 1 << 22
"""Entries of a weight written at a time by :func:`apply_update`: its workspace is a few float32 tensors of this
many entries (16 MiB each). Part of the rounding's definition: a generator's draws follow the slices."""


def accumulate_grad(layer, coef: torch.Tensor, into: dict[str, torch.Tensor] | None = None) -> None:
    """Add ``sum_d coef_d z_d`` to ``.grad`` of every perturbed parameter of ``layer`` (created if None), or of the
    tensor ``into`` gives for it (a float32 master of a half one)."""
    _check_coef(layer, coef)
    for slot in layer.slots:
        p = (into or {}).get(slot.name)
        p = layer.get_parameter(slot.name) if p is None else p
        g = _estimate(layer, slot, coef, p)
        if p.grad is None:  # a fresh tensor, so it can become .grad as is
            p.grad = g
        else:
            p.grad.add_(g)


class Rule(Protocol):
    """How an in-place update turns a slice of the estimate into new weights (plain SGD, Adam: see
    :mod:`nesgpu.inplace`)."""

    coef_factor: float  # what the estimate is multiplied by before step_ sees it (SGD: -lr, so g is the step)

    def step_(self, target: torch.Tensor, g: torch.Tensor, param: torch.Tensor, view: Callable,
              generator: torch.Generator | None) -> torch.Tensor:
        """The new weights of ``target`` (a slice of ``param``) from ``g``, the same slice of ``coef_factor`` times
        the estimate (float32, the rule's to overwrite): ``target`` itself updated in place where no ``generator``
        is given (full precision), else a float32 tensor to round (``target`` unchanged). ``view(t)`` is the same
        slice of any tensor shaped like ``param`` (its state); ``generator`` the parameter's rounding generator."""
        ...


@torch.no_grad()
def apply_update(layer, coef: torch.Tensor, generator: Callable[[int, torch.device], torch.Generator],
                 rule: Rule) -> None:
    """Every perturbed parameter ``p`` of ``layer`` stepped in place by ``rule`` from ``g = sum_d coef_d z_d``
    (``coef`` already times ``rule.coef_factor``), slice by slice. ``generator(i, device)`` gives the rounding
    generator of the module's i-th perturbed parameter (asked only for half-precision ones)."""
    _check_coef(layer, coef)
    for index, slot in enumerate(layer.slots):
        p = layer.get_parameter(slot.name)
        if not p.numel():
            continue
        gen = generator(index, p.device) if p.dtype in HALF else None
        noise, exact = layer.noise_record(slot.name), _exact(p)
        c = coef.to(device=p.device, dtype=exact)
        sliced = p.dim() == 2 and p.is_contiguous() and layer.stored_as_drawn(slot.name)
        rows = max(1, SLICE // p.shape[1]) if sliced else 0
        first = slot.kind.grad_rows(noise, c, slice(0, min(rows, len(p)))) if sliced else None
        if first is not None:  # by rows: the estimate of one slice at a time
            for start in range(0, len(p), rows):
                part = slice(start, min(start + rows, len(p)))
                g = first if start == 0 else slot.kind.grad_rows(noise, c, part)
                _step_(rule, p, lambda t, part=part: t[part], g, gen)
            continue
        g = _estimate(layer, slot, coef, p, exact).reshape(-1)
        if not p.is_contiguous():  # a strided parameter: one pass over the whole
            _step_(rule, p, lambda t: t, g.view(p.shape), gen)
            continue
        for start in range(0, p.numel(), SLICE):
            part = slice(start, min(start + SLICE, p.numel()))
            _step_(rule, p, lambda t, part=part: t.view(-1)[part], g[part], gen)


def _check_coef(layer, coef: torch.Tensor) -> None:
    if coef.shape != (layer.local_directions,):
        raise ValueError(f"coef must have shape ({layer.local_directions},); got {tuple(coef.shape)}")


def _exact(p: torch.Tensor) -> torch.dtype:
    """The dtype the estimate of ``p`` is computed in: float32 for a half-precision parameter (its noise's)."""
    return torch.float32 if p.dtype in HALF else p.dtype


def _estimate(layer, slot, coef: torch.Tensor, p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``sum_d coef_d z_d`` of ``slot`` in the layout ``p`` is stored in, in ``dtype`` (default: ``p``'s)."""
    noise = layer.noise_record(slot.name)
    g = slot.kind.grad(noise, coef.to(device=p.device, dtype=_exact(p))).to(dtype or p.dtype)
    return layer.as_stored(slot.name, g.reshape(1, *noise.shape))[0].contiguous()


def _step_(rule: Rule, param: torch.Tensor, view: Callable, g: torch.Tensor,
           generator: torch.Generator | None) -> None:
    """One slice of ``param`` stepped by ``rule``: in place in its own dtype, or for a half-precision parameter in
    float32, stochastically rounded back."""
    target = view(param)
    if generator is None:
        rule.step_(target, g.to(target.dtype), param, view, None)
        return
    target.copy_(stochastic_round_(rule.step_(target, g, param, view, generator), target.dtype, generator))


__all__ = ["SLICE", "Rule", "accumulate_grad", "apply_update"]
