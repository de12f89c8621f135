"""The exact fallback for a module that a population call found it needs (see
:class:`nesgpu.layers.guarded_value.NeedsFallback`): a parent that computes with a child's weight, or regroups its
rows, or whose own code fails on the population's rows (a shape error in a module that mixes them). The
module's subtree is made plain again and runs, as one, through torch.func, exactly."""

from __future__ import annotations

from torch import nn

from .exporting import unconvert
from .layers import FunctionalPerturbed, PerturbedModule, functional_fallback
from .layers.guarded_value import NeedsFallback
from .memory import out_of_memory

_ERRORS = (RuntimeError, IndexError, ValueError, TypeError)  # what a module's code raises on rows it cannot take


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


def failing_module(model: nn.Module, error: BaseException) -> NeedsFallback | ValueError | None:
    """Where ``error``, raised during a population call, comes from the own ``forward`` of a plain module of
    ``model`` (not a perturbed one, not inside the fallback): a :class:`NeedsFallback` for that module, whose
    code fails on the population's rows; None for any other error (nesgpu's own, a task's, out of memory); a
    ValueError where the input is at fault (an embedding's token id outside its table)."""
    if isinstance(error, NeedsFallback) or not isinstance(error, _ERRORS) or out_of_memory(error):
        return None
    names = {id(m): n for n, m in model.named_modules()}
    deepest = None
    frame = error.__traceback__
    while frame is not None:
        module = frame.tb_frame.f_locals.get("self")
        if isinstance(module, FunctionalPerturbed):
            return None  # the fallback's own member calls: its error (it names the module) stands
        if isinstance(module, nn.Module) and id(module) in names and frame.tb_frame.f_code.co_name == "forward":
            deepest = module
        frame = frame.tb_next
    if deepest is None or isinstance(deepest, PerturbedModule):
        return None
    name = names[id(deepest)]
    text = (str(error).splitlines() or [""])[0][:200]
    label = f"{name or 'model'} ({type(deepest).__name__})"
    if isinstance(deepest, nn.Embedding) and isinstance(error, IndexError):  # the input's fault, not the rows'
        return ValueError(f"{label}: token ids must be in [0, {deepest.num_embeddings}) (its vocabulary); the "
                          f"input has an id outside it ({type(error).__name__}: {text})")
    return NeedsFallback(f"{label} fails on the population's rows ({type(error).__name__}: {text}): its code mixes "
                         f"or regroups them; run it through the exact fallback (convert(..., fallback=[{name!r}])) or "
                         f"freeze it", name, f"fails on the population's rows ({type(error).__name__}: {text})")


__all__ = ["failing_module", "fall_back", "fallback_root"]
