"""A perturbed module's perturbation state: one object the module owns (``module.perturbation``). The parts of
:class:`nesgpu.layers.PerturbedModule` (its products, ties and read guard, scales) and its subclasses read it
through these fields; anything else uses the module's public methods and properties."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kinds import Geometry, Noise
from ..noise import NoiseSource
from .layout import Cached
from .plan import CallPlan
from .sharing import Borrowed
from .slots import Active, Slot


@dataclass(eq=False)
class Perturbation:
    """What a perturbed module perturbs, how, and the noise it holds. Its fields are plain attributes, set
    without ``nn.Module.__setattr__``'s checks (the forward reads and sets some of them every decode step)."""

    matrices: dict[str, Geometry]
    """The parameters the module's kind perturbs (name -> geometry); every other one is perturbed elementwise."""
    recurse: bool
    """Whether the parameters of its children are its own too (the exact fallback, attention with sinks)."""
    transposed: frozenset[str]
    """The matrices stored (in, out) (GPT-2's Conv1D, an expert bank's)."""
    banks: frozenset[str]
    """The matrices that are a bank of matrices (MoE experts)."""
    borrowed: dict[str, Borrowed] = field(default_factory=dict)
    """The parameters tied to another module's, by attribute name."""
    slots: list[Slot] = field(default_factory=list)
    """The parameters it perturbs (``declare_parameters``)."""
    guarded: frozenset[str] = frozenset()
    """The parameters a parent's read gets as a guarded value in a population call (perturbed or borrowed)."""
    inside: bool = False
    """True while the module runs its own population forward (the read guard lets its parameters through)."""
    noise: dict[str, Noise] | None = None
    """The current noise by parameter (None: none drawn, or freed)."""
    source: NoiseSource | None = None
    """The random stream the noise was drawn from."""
    drawn: range = range(0)
    """The directions the current noise covers."""
    active: Active | None = None
    """sigma and antithetic while the module is inside ``perturbing`` (None: a plain module)."""
    repeat_scale: Cached | None = None
    """The last repeat_scale and its key."""
    plans: dict[tuple, CallPlan] = field(default_factory=dict)
    """Plain calls' plans within a population call (plan.py)."""
    scales: dict[str, torch.Tensor] = field(default_factory=dict)
    """A sigma per entry, by parameter (scales.py); a parameter without one has S = 1."""


__all__ = ["Perturbation"]
