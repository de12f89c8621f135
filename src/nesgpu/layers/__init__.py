"""Perturbed modules: one file per module family, each a thin torch subclass over the kinds' functions."""

from ..kinds import KINDS
from .attention import PerturbedMultiheadAttention, PerturbedTransformerDecoderLayer, PerturbedTransformerEncoderLayer
from .base import PerturbedModule
from .conv import FlipoutConv2d, LowRankConv2d, PermutedConv2d, PerturbedConv1d, PerturbedConv2d, PerturbedConv3d
from .drawing import HALF
from .embedding import PerturbedEmbedding
from .form import ConversionOptions, Form
from .form_table import FORMS, register_form
from .functional import FunctionalPerturbed, functional_fallback
from .layout import repeat_signs
from .linear import FlipoutLinear, LowRankLinear, PermutedLinear, PerturbedLinear, SparsePerturbedLinear
from .lowbit import LowBitConv1d, LowBitConv2d, LowBitConv3d, LowBitLinear
from .norm import (
                   PerturbedBatchNorm1d,
                   PerturbedBatchNorm2d,
                   PerturbedBatchNorm3d,
                   PerturbedGroupNorm,
                   PerturbedLayerNorm,
                   PerturbedRMSNorm,
)
from .recurrent import PerturbedGRU, PerturbedLSTM, PerturbedRNN
from .slots import Slot

__all__ = [
    "ConversionOptions", "FORMS", "Form", "HALF", "KINDS", "register_form", "FlipoutConv2d", "FlipoutLinear", "FunctionalPerturbed",
    "LowBitConv1d", "LowBitConv2d", "LowBitConv3d", "LowBitLinear", "LowRankConv2d", "LowRankLinear",
    "PermutedConv2d", "PermutedLinear", "PerturbedBatchNorm1d", "PerturbedBatchNorm2d", "PerturbedBatchNorm3d",
    "PerturbedConv1d", "PerturbedConv2d", "PerturbedConv3d", "PerturbedEmbedding", "PerturbedGRU",
    "PerturbedGroupNorm", "PerturbedLSTM", "PerturbedLayerNorm", "PerturbedLinear", "PerturbedModule",
    "PerturbedMultiheadAttention", "PerturbedRMSNorm", "PerturbedRNN", "PerturbedTransformerDecoderLayer",
    "PerturbedTransformerEncoderLayer", "Slot", "SparsePerturbedLinear", "functional_fallback", "repeat_signs",
]
