"""The exact fallback for any other module: per-member parameters through torch.func.

A module that no perturbed layer covers (a custom module with a bare ``nn.Parameter``, ``nn.PReLU``,
``nn.Bilinear``, ...) is evaluated member by member: every trainable parameter of the module and of its
children gets IID Gaussian noise, ``theta + sigma * s_r * z_d`` is built for every row, and
``torch.func.vmap`` runs ``torch.func.functional_call`` over the rows, each row as a batch of one.
It is exact and slow: it materialises R * D copies of the module's parameters and loses the batched
products, so keep it for small modules (``nesgpu bench layers`` measures it).

Its input is the population rows (the model's input rows), or those rows' tokens flattened to 2-D,
(rows * T, features), as an MoE router sees them: member i then owns tokens [i T, (i + 1) T). Any other
first dimension is an error naming the module, never a guess. A module vmap cannot run (data-dependent
control flow) runs member by member in a loop.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..kinds import Gaussian
from .base import PerturbedModule
from .swap import swap_class


class FunctionalPerturbed(PerturbedModule):
    """Mixin of the fallback: use :func:`functional_fallback` to apply it to a module."""

    def population_forward(self, *args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None or first.dim() < 1:
            raise ValueError(f"{type(self).__name__}: a population call needs a tensor argument whose first "
                             f"dimension is the rows (repeats * directions); got {[type(a).__name__ for a in args]}")
        n, rows = first.shape[0], self.population_rows or first.shape[0]
        if n % rows or (n != rows and first.dim() != 2):  # flattened tokens are (rows * T, features)
            raise ValueError(f"{type(self).__name__}: its input has {n} rows on the first dimension, neither the "
                             f"population's {rows} rows nor their tokens flattened (rows x T), so the exact "
                             f"fallback cannot tell which member each row belongs to; freeze it with "
                             f"convert(..., freeze=[...])")
        tokens = n // rows if n != rows else None  # rows * T tokens: member i owns tokens [i T, (i + 1) T)
        pop = self._population(rows, first.dtype if first.is_floating_point() else torch.get_default_dtype(),
                               first.device)
        params = {name: self._member_values(name, pop, p.dtype).reshape(rows, *p.shape)
                  for name, p in self.perturbed_parameters().items()}
        names = list(kwargs)
        values = [kwargs[k] for k in names]
        batched = [isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == n for a in (*args, *values)]
        inputs = [a.view(rows, tokens, *a.shape[1:]) if b and tokens else a for a, b in zip((*args, *values), batched)]

        def member(member_params, *member_args):
            member_args = [a.unsqueeze(0) if b and not tokens else a for a, b in zip(member_args, batched)]
            positional, keywords = member_args[:len(args)], dict(zip(names, member_args[len(args):]))
            out = functional_call(self, member_params, tuple(positional), keywords)
            return out if tokens else tree_map(lambda t: t.squeeze(0) if isinstance(t, torch.Tensor) else t, out)

        active, self._active = self._active, None  # the inner calls run the plain forward
        try:
            out = _per_member(member, params, inputs, batched, rows)
        finally:
            self._active = active
        if tokens:  # (rows, T, ...) back to the flattened tokens
            out = tree_map(lambda t: t.flatten(0, 1) if isinstance(t, torch.Tensor) and t.dim() >= 2
                           and t.shape[1] == tokens else t, out)
        return out


def _per_member(member, params, inputs, batched, rows):
    """``member`` for every row, vectorised with vmap; a module vmap cannot run (data-dependent control flow,
    ``.item()``) runs row by row, which is exact too."""
    try:
        # "different": dropout and other random ops draw independently for every member
        return vmap(member, in_dims=(0, *[0 if b else None for b in batched]), randomness="different")(
            params, *inputs)
    except RuntimeError:
        outs = [member({k: v[i] for k, v in params.items()}, *[a[i] if b else a for a, b in zip(inputs, batched)])
                for i in range(rows)]
        flat = [tree_flatten(o)[0] for o in outs]
        spec = tree_flatten(outs[0])[1]
        return tree_unflatten([torch.stack(leaves) if isinstance(leaves[0], torch.Tensor) else leaves[0]
                               for leaves in zip(*flat)], spec)


def functional_fallback(module: nn.Module, directions: int | None = None) -> nn.Module:
    """Turn ``module`` (in place) into its population-aware version that perturbs every trainable parameter
    of it and of its children exactly, through torch.func. Its class becomes a subclass of its own, so its
    state_dict, parameters and plain forward stay the same."""
    swap_class(module, FunctionalPerturbed, "Functional")
    module._init_perturbation(Gaussian(), directions, {}, "elementwise", recurse=True)
    return module
