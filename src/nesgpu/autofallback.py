"""The exact fallback for a module that a population call found it needs (see
:class:`nesgpu.layers.guard.NeedsFallback`): a parent that computes with a child's weight, or regroups its
rows. The module's subtree is made plain again and runs, as one, through torch.func, exactly."""

from __future__ import annotations

from torch import nn

from .export import unconvert
from .layers import FunctionalPerturbed, PerturbedModule, functional_fallback


def fallback_root(model: nn.Module, name: str) -> str:
    """``name``, or its nearest parent with a forward of its own where it is a container (a ModuleList's
    children are called by its parent)."""
    while name and isinstance(model.get_submodule(name), (nn.ModuleList, nn.ModuleDict)):
        name = name.rpartition(".")[0]
    return name


def fall_back(model: nn.Module, name: str, directions: int | None) -> nn.Module:
    """Module ``name`` of the converted ``model`` (in place; "" is the model itself) with its children plain
    again and the whole in the exact fallback, the same Parameter objects throughout. Raises ValueError where
    that cannot be done (a tie across the module's boundary, a BatchNorm inside, a fallback already)."""
    module = model.get_submodule(name)
    label = f"{name or 'model'} ({type(module).__name__})"
    if isinstance(module, FunctionalPerturbed):
        raise ValueError(f"{label} runs through the exact fallback already")
    inside = {id(m) for m in module.modules()}
    for m in model.modules():
        for attr, tie in (m.ties.items() if isinstance(m, PerturbedModule) else ()):
            if (id(m) in inside) != (id(tie.owner) in inside):
                raise ValueError(f"{label} shares the tied parameter {tie.label!r} with a module outside it")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        raise ValueError(f"{label} contains a BatchNorm, which the exact fallback cannot evaluate member by member")
    plain = unconvert(module)
    if plain is not module:
        if not name:
            raise ValueError(f"{label} is itself a perturbed layer; convert its parent instead")
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, plain)
    return functional_fallback(plain, directions)


__all__ = ["fall_back", "fallback_root"]
