"""The shared-input shortcut of a Sequential model: when every member sees the same batch, a Sequential whose
first perturbed module is a Linear (reached through parameter-free row-wise modules: Flatten, Identity) lets that
Linear compute the plain product once per sample and add each direction's noise, never building the repeated
rows (:meth:`nesgpu.layers.PerturbedLinear.population_forward_shared`)."""

from __future__ import annotations

import torch
from torch import nn

from .linear import PerturbedLinear


def shared_entry(model: nn.Module) -> tuple[list[nn.Module], PerturbedLinear, list[nn.Module]] | None:
    """(row-wise modules before, the first perturbed Linear, the modules after) of a Sequential ``model`` whose
    first perturbed module is a Linear; None for any other model."""
    if not isinstance(model, nn.Sequential):
        return None
    modules = list(model)
    for i, module in enumerate(modules):
        # a subclass with its own population forward qualifies only with its own shared-input forward
        plain = isinstance(module, PerturbedLinear) and (
            type(module).population_forward is PerturbedLinear.population_forward
            or type(module).population_forward_shared is not PerturbedLinear.population_forward_shared)
        if plain:
            return modules[:i], module, modules[i + 1:]
        row_wise = isinstance(module, nn.Identity) or (
            isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1)
        if not row_wise:
            return None
    return None


def shared_forward(model: nn.Module, x: torch.Tensor, signs: int) -> torch.Tensor | None:
    """The population output of ``model`` (inside a population call) on one batch ``x`` every member sees,
    laid out as the repeated rows (signs, B, D) would be; None where the shortcut does not apply (another
    model, or an input that is not 2-D at the Linear)."""
    entry = shared_entry(model)
    if entry is None:
        return None
    prefix, first, rest = entry
    h = x
    for module in prefix:
        h = module(h)
    if h.dim() != 2:
        return None
    with first.own_call():
        h = first.population_forward_shared(h, signs)
    for module in rest:
        h = module(h)
    return h


__all__ = ["shared_entry", "shared_forward"]
