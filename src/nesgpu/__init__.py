"""nesgpu: evolution strategies for PyTorch, with the whole population in one batched forward pass."""

from .layers import (
    FlipoutConv2d,
    FlipoutLinear,
    LowRankConv2d,
    LowRankLinear,
    PermutedConv2d,
    PermutedLinear,
    PerturbedConv2d,
    PerturbedLayer,
    PerturbedLinear,
    SparsePerturbedLinear,
)
from .model import PerturbedModel, convert

__version__ = "0.1.0"

__all__ = [
    "PerturbedModel", "convert", "PerturbedLayer",
    "PerturbedLinear", "PerturbedConv2d", "SparsePerturbedLinear", "PermutedLinear", "PermutedConv2d",
    "FlipoutLinear", "FlipoutConv2d", "LowRankLinear", "LowRankConv2d",
]
