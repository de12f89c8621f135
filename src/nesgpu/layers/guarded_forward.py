"""Perturbed modules that keep their torch class's own forward and compute, per member, the uses of their own
parameters that forward makes (an MoE router's ``F.linear(tokens, weight)``, attention sinks viewed over
the batch): every read of such a parameter inside that forward is a :class:`nesgpu.layers.guarded_value.GuardedValue`,
and each use asks :meth:`guarded_use`."""

from __future__ import annotations

import torch

from .base import PerturbedModule
from .guarded_value import GuardedValue

CASTS = frozenset({torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as, torch.Tensor.float, torch.Tensor.double,
                   torch.Tensor.half, torch.Tensor.bfloat16})
"""The casts a guarded parameter may take: the result is the same guarded parameter in the new dtype."""


class GuardedForward(PerturbedModule):
    """A perturbed module whose population forward is its torch class's own forward, with its perturbed
    parameters guarded there (see the module docstring); a subclass overrides ``own_use``."""

    def population_forward(self, *args, **kwargs):
        state = self.perturbation
        inside, state.inside = state.inside, False  # its own forward reads its parameters as GuardedValues
        try:
            return super(PerturbedModule, self).forward(*args, **kwargs)  # the torch class's own forward
        finally:
            state.inside = inside

    def guarded_use(self, guard, func, args, kwargs):
        """A cast of one of its own guarded parameters is that parameter in the new dtype; any other use of its
        own asks :meth:`own_use`; a parameter of another module is not its to compute."""
        if guard.owner is not self:
            return NotImplemented
        cast = guarded_cast(guard, func, args, kwargs)
        return cast if cast is not None else self.own_use(guard, func, args, kwargs)

    def own_use(self, guard, func, args, kwargs):
        """``func(*args, **kwargs)`` on this module's own guarded parameter, computed per member, or
        NotImplemented (an error)."""
        return NotImplemented


def guarded_cast(guard: GuardedValue, func, args: tuple, kwargs: dict) -> GuardedValue | None:
    """``guard`` read in another dtype, where ``func(guard, ...)`` is a cast (``.float()``, ``.to(dtype)``) that
    keeps its device; None for any other call."""
    if func not in CASTS or not args or args[0] is not guard:
        return None
    with torch._C.DisableTorchFunctionSubclass():  # the cast's dtype, read off an empty tensor
        cast = func(torch.empty(0, dtype=guard.dtype, device=guard.device), *args[1:], **kwargs)
    if not isinstance(cast, torch.Tensor) or cast.device != guard.device:
        return None
    return guard.cast(cast.dtype)


__all__ = ["CASTS", "GuardedForward", "guarded_cast"]
