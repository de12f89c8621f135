"""The exact fallback for any other module: per-member parameters through torch.func.

A module that no perturbed layer covers (a custom module with a bare ``nn.Parameter``, ``nn.PReLU``,
``nn.Bilinear``, ...) is evaluated member by member: every trainable parameter of the module and of its
children gets IID Gaussian noise, ``theta + sigma * s_r * z_d`` is built for every row, and
``torch.func.vmap`` runs ``torch.func.functional_call`` over the rows, each row as a batch of one.
It is exact and slow: it materialises R * D copies of the module's parameters and loses the batched
products, so keep it for small modules (``nesgpu bench layers`` measures it).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_map

from ..kinds import Gaussian
from .base import PerturbedModule


class FunctionalPerturbed(PerturbedModule):
    """Mixin of the fallback: use :func:`functional_fallback` to apply it to a module."""

    def population_forward(self, *args, **kwargs):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is None or first.dim() < 1:
            raise ValueError(f"{type(self).__name__}: a population call needs a tensor argument whose first "
                             f"dimension is the rows (repeats * directions); got {[type(a).__name__ for a in args]}")
        n = first.shape[0]
        pop = self._population(n, first.dtype if first.is_floating_point() else torch.get_default_dtype(),
                               first.device)
        params = {name: self._member_values(name, pop, p.dtype).reshape(n, *p.shape)
                  for name, p in self.perturbed_parameters().items()}
        def is_batched(a):
            return isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == n

        names = list(kwargs)
        values = [kwargs[k] for k in names]
        batched = [is_batched(a) for a in (*args, *values)]

        def member(member_params, *member_args):
            member_args = [a.unsqueeze(0) if b else a for a, b in zip(member_args, batched)]
            positional, keywords = member_args[:len(args)], dict(zip(names, member_args[len(args):]))
            out = functional_call(self, member_params, tuple(positional), keywords)
            return tree_map(lambda t: t.squeeze(0) if isinstance(t, torch.Tensor) else t, out)

        active, self._active = self._active, None  # the inner calls run the plain forward
        try:
            # "different": dropout and other random ops draw independently for every member
            return vmap(member, in_dims=(0, *[0 if b else None for b in batched]), randomness="different")(
                params, *args, *values)
        finally:
            self._active = active


def functional_fallback(module: nn.Module, directions: int | None = None) -> nn.Module:
    """Turn ``module`` (in place) into its population-aware version that perturbs every trainable parameter
    of it and of its children exactly, through torch.func. Its class becomes a subclass of its own, so its
    state_dict, parameters and plain forward stay the same."""
    cls = type(module)
    module.__class__ = type(f"Functional{cls.__name__}", (FunctionalPerturbed, cls),
                            {"__module__": cls.__module__, "__doc__": FunctionalPerturbed.__doc__})
    module._init_perturbation(Gaussian(), directions, {}, "elementwise", recurse=True)
    return module
