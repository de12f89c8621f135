"""Plain torch modules from a converted model, for deployment: :func:`export`.

A perturbed module rebuilt from a torch type (``PerturbedLinear``, ``PerturbedLSTM``, ...) becomes that torch
type again; a module whose class was swapped in place (the exact fallback, ``transformers`` types) gets its
own class back, without the perturbation's attributes. Parameters (and their ties) and buffers carry over,
so the exported model computes what the converted model's plain calls compute; a low-bit layer becomes the
float layer with its quantised (dequantised) weights.
"""

from __future__ import annotations

import copy

from torch import nn

from .layers import LowBitConv1d, LowBitConv2d, LowBitConv3d, LowBitLinear, PerturbedLinear, PerturbedModule
from .layers.functional import FALLBACK_ROOT, child_call_guard
from .layers.registry import CONVERSIONS, rebuilt_as
from .layers.sharing import ALIASES
from .masters import MASTERS, sync_masters

LOW_BIT_LAYERS = (LowBitLinear, LowBitConv1d, LowBitConv2d, LowBitConv3d)


def export(model: nn.Module) -> nn.Module:
    """A copy of ``model`` without nesgpu's modules: plain torch (or ``transformers``) modules with the
    trained weights. ``model`` itself stays converted.

    Example:
        >>> plain = nesgpu.export(pm.model)
        >>> torch.save(plain.state_dict(), "model.pt")  # or plain.save_pretrained(DIR) for a HF model
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    sync_masters(model)  # a half-precision model: the weights of the optimizer's latest step, not the last call's
    for m in model.modules():
        if isinstance(m, PerturbedModule):
            m.free_memory()  # the noise is not part of the model (and not copied)
    plain = copy.deepcopy(model)
    for m in plain.modules():  # PerturbedModel's hooks (master weights, input dtype) belong to the original
        for key, hook in list(m._forward_pre_hooks.items()):
            if getattr(hook, "__module__", "").startswith("nesgpu."):
                del m._forward_pre_hooks[key]
    return unconvert(plain)


def unconvert(model: nn.Module) -> nn.Module:
    """``model`` made plain in place (what :func:`export` does to its copy): every nesgpu module back to its
    torch or ``transformers`` module, with the same Parameter objects. Returns the model (a new object when the
    model itself was a rebuilt perturbed module)."""
    for m in model.modules():  # the exact fallback's guards on its children, the guards of aliases
        m.__dict__.pop(FALLBACK_ROOT, None)
        m.__dict__.pop(ALIASES, None)
        m.__dict__.pop(MASTERS, None)  # the original's PerturbedModel's
        for key, hook in list(m._forward_pre_hooks.items()):
            if hook is child_call_guard:
                del m._forward_pre_hooks[key]
    rebuilt = []
    for name, module in list(model.named_modules())[1:]:
        if any(name.startswith(f"{done}.") for done in rebuilt) or not _is_ours(module):
            continue  # inside a module rebuilt whole (its children are plain), or plain already
        new = _plain(module)
        if new is not module:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, new)
            rebuilt.append(name)
    return _plain(model) if _is_ours(model) else model


def _is_ours(module: nn.Module) -> bool:
    """Whether converting made the module's class (it is, or derives from, one of nesgpu.layers'); nesgpu's
    plain models (an RL task's Policy, its ObservationNorm) are torch modules like any other."""
    return any(_converting(c) for c in type(module).__mro__)


def _converting(cls: type) -> bool:
    return cls.__module__.startswith("nesgpu.layers.")


def _plain(module: nn.Module) -> nn.Module:
    """The plain module of one of nesgpu's: a rebuilt torch type is built again as that type (a new
    module); a class swapped in place gets its own class back (the same module)."""
    rebuilt = next((c for c in CONVERSIONS if type(module) is c.target or
                    (isinstance(module, LOW_BIT_LAYERS) and c.source in type(module).__mro__)), None)
    if rebuilt is not None:
        return _rebuilt(module, rebuilt)
    original = next(c for c in type(module).__mro__[1:] if not _converting(c))
    if isinstance(module, PerturbedModule):
        for attribute in _perturbation_attributes():
            module.__dict__.pop(attribute, None)
    module.__class__ = original
    return module


def _rebuilt(module: PerturbedModule, conversion) -> nn.Module:
    if getattr(module, "act_bits", None) is not None:
        raise ValueError(f"{type(module).__name__} with act_bits={module.act_bits} quantises its inputs: no plain "
                         f"torch module computes the same; export the model trained without act_bits")
    plain = rebuilt_as(conversion.source, module, **conversion.args(module))
    if isinstance(module, LOW_BIT_LAYERS):
        plain.weight = nn.Parameter(module.quantized_weight().detach().clone(),
                                    requires_grad=module.weight.requires_grad)
    plain.train(module.training)
    return plain


def _perturbation_attributes() -> set[str]:
    """What converting adds to a module's ``__dict__`` (measured on a Linear)."""
    return set(vars(PerturbedLinear(1, 1))) - set(vars(nn.Linear(1, 1)))


__all__ = ["export", "unconvert"]
