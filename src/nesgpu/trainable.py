"""Which parameters ES can train: each trainable one is perturbed by a perturbed module, holds at least one
value, and is real."""

from __future__ import annotations

from torch import nn

from .layers.base import PerturbedModule


def uncovered_parameters(model: nn.Module) -> list[str]:
    """Names of the trainable parameters of ``model`` that no perturbed module perturbs."""
    covered = {id(p) for m in model.modules() if isinstance(m, PerturbedModule)
               for p in m.perturbed_parameters().values()}
    return [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in covered]


def check_trainable(model: nn.Module) -> None:
    """Refuse what ES cannot train: an empty parameter (a layer of size 0), a complex one (the noise and the
    steps are real: it would lose its imaginary part)."""
    empty = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad and p.numel() == 0]
    if empty:
        raise ValueError(f"parameter {empty[0][0]!r} has no elements (shape {empty[0][1]}); expected every trainable "
                         f"parameter to hold at least one value: give the layer a size, or freeze it")
    complex_ = [(n, p.dtype) for n, p in model.named_parameters() if p.requires_grad and p.is_complex()]
    if complex_:
        (name, dtype), = complex_[:1]
        raise TypeError(f"parameter {name!r} is complex ({str(dtype).removeprefix('torch.')}); expected real "
                        f"parameters (the noise and the steps are real): hold its real and imaginary parts as two "
                        f"real parameters, or freeze it with convert(..., freeze=[{name!r}])")


__all__ = ["check_trainable", "uncovered_parameters"]
