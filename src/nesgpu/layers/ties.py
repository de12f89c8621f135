"""Tied parameters (one tensor used by several modules) after conversion: one module draws their noise and takes
the update, the others borrow it; a plain module holding a parameter that a perturbed child perturbs reads it
guarded (see :mod:`nesgpu.layers.sharing`)."""

from __future__ import annotations

from torch import nn

from .base import PerturbedModule
from .functional import FunctionalPerturbed
from .sharing import ALIASES, Alias, AliasHolder
from .swap import swap_class


def own_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters ``module`` holds itself, by attribute, without those a child of it holds too (BERT's
    LM-head bias, registered on the head and on its decoder: the decoder's, which perturbs it)."""
    inner = {id(p) for child in module.children() for p in child.parameters()}
    return {name: p for name, p in module.named_parameters(recurse=False) if id(p) not in inner}


def tied_uses(model: nn.Module) -> list[list[tuple[str, str]]]:
    """The trainable parameters used by several modules, each as its (module name, attribute) uses; a
    module holding a parameter that a child of it holds too is not a use (see :func:`own_parameters`)."""
    uses: dict[int, list[tuple[str, str]]] = {}
    for module_name, module in model.named_modules():
        for attr, p in own_parameters(module).items():
            if p.requires_grad:
                uses.setdefault(id(p), []).append((module_name, attr))
    return [group for group in uses.values() if len(group) > 1]


def guard_aliases(model: nn.Module) -> None:
    """A module holding a parameter that a perturbed child of it perturbs reads it as that child's, guarded:
    its metadata passes, any other use in a population call needs the module in the exact fallback."""
    for module in model.modules():
        if isinstance(module, PerturbedModule):
            continue
        own = own_parameters(module)
        held = {id(p): attr for attr, p in module.named_parameters(recurse=False) if attr not in own}
        aliases = {held[id(q)]: Alias(m, name) for m in module.modules() if held and isinstance(m, PerturbedModule)
                   for name, q in m.perturbed_parameters().items() if id(q) in held}
        if aliases:
            swap_class(module, AliasHolder, "Aliased")
            module.__dict__[ALIASES] = aliases


def retie(model: nn.Module, ties: list[list[tuple[str, str]]]) -> None:
    """Make each tied group one Parameter again, drawn and updated by one module, borrowed by the others."""
    for group in ties:
        uses = [(model.get_submodule(m), attr, f"{m}.{attr}" if m else attr) for m, attr in group]
        name = uses[0][2]  # the name named_parameters gives the tied tensor (its first use): what freeze takes
        for module, _, full in uses:
            if not isinstance(module, PerturbedModule) or isinstance(module, FunctionalPerturbed):
                raise ValueError(f"tied parameter {full!r} is used by {type(module).__name__}, which has no batched "
                                 f"perturbed version to share its noise; untie it, or freeze it with "
                                 f"convert(..., freeze=[{name!r}])")
        uses.sort(key=lambda use: not isinstance(use[0], nn.Embedding))  # a table owns: its padding row stays zero
        problems = []
        for owner, owner_attr, label in uses:  # the first use whose kind has every other use's product
            problems = [p for module, attr, _ in uses if module is not owner
                        for p in [module.borrow_problem(attr, owner, owner_attr)] if p]
            if not problems:
                for module, attr, _ in uses:
                    if module is not owner:
                        setattr(module, attr, getattr(owner, owner_attr))
                        module.borrow(attr, owner, owner_attr, label)
                break
        if problems:
            raise ValueError(f"tied parameters {[full for *_, full in uses]} cannot share one noise: {problems[0]}")
