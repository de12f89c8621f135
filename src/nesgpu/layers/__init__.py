"""Perturbed layers: one file per perturbation kind, each for Linear and (where it exists) Conv2d."""

from .base import PerturbedConv2dBase, PerturbedLayer, PerturbedLinearBase
from .flipout import FlipoutConv2d, FlipoutLinear
from .gaussian import PerturbedConv2d, PerturbedLinear
from .lowrank import LowRankConv2d, LowRankLinear
from .permuted import PermutedConv2d, PermutedLinear
from .sparse import SparsePerturbedLinear

# kind name -> (Linear class, Conv2d class or None)
KINDS: dict[str, tuple[type[PerturbedLayer], type[PerturbedLayer] | None]] = {
    "gaussian": (PerturbedLinear, PerturbedConv2d),
    "sparse": (SparsePerturbedLinear, None),
    "permuted": (PermutedLinear, PermutedConv2d),
    "flipout": (FlipoutLinear, FlipoutConv2d),
    "lowrank": (LowRankLinear, LowRankConv2d),
}

__all__ = [
    "KINDS", "PerturbedLayer", "PerturbedLinearBase", "PerturbedConv2dBase",
    "PerturbedLinear", "PerturbedConv2d", "SparsePerturbedLinear", "PermutedLinear", "PermutedConv2d",
    "FlipoutLinear", "FlipoutConv2d", "LowRankLinear", "LowRankConv2d",
]
