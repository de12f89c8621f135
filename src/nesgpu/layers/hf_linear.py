"""transformers' linear and embedding types: GPT-2's Conv1D (a Linear stored as (in, out)), Linear
subclasses whose forward computes ``F.linear`` (Falcon's), scaled word embeddings (Gemma's, BART's)."""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Geometry, Kind
from .base import PerturbedModule
from .embedding import PerturbedEmbedding
from .form import ConversionOptions, Form
from .layout import compute_dtype
from .linear import PerturbedLinear
from .probing import probe
from .swap import swap_class


class PerturbedConv1D(PerturbedModule):
    """transformers' Conv1D (y = x W + b, W of shape (in, out)) with the kind's noise on W.

    Shape: population input (R * D, *, in) -> (R * D, *, out); row n uses direction n % D.
    """

    ROW_WISE = True
    PLANNED = True

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"{type(self).__name__}: expected input of shape (repeats * directions, ..., "
                             f"{self.weight.shape[0]}); got {tuple(x.shape)}")
        pop = self.population_of(x.shape[0], compute_dtype(x), x.device)
        return self.perturbed_linear(x, pop, "weight", "bias")

    def call_plan(self, x, layout):
        return self.linear_plan(x, layout)

    __repr__ = nn.Module.__repr__  # transformers' Conv1D writes its own, which would hide the kind

    def extra_repr(self) -> str:
        return f"nf={self.weight.shape[1]}, nx={self.weight.shape[0]}, {super().extra_repr()}"


class PerturbedScaledEmbedding(PerturbedEmbedding):
    """An nn.Embedding subclass whose forward multiplies the lookup by a constant ``embed_scale`` (Gemma's
    scaled word embedding), with the kind's noise on the table."""

    def population_forward(self, index: torch.Tensor) -> torch.Tensor:
        scale = self.embed_scale
        return super().population_forward(index) * (scale.to(self.weight.dtype) if isinstance(scale, torch.Tensor)
                                                     else scale)


def is_conv1d(module: nn.Module) -> bool:
    utils = sys.modules.get("transformers.pytorch_utils")  # only if the user's program imported transformers
    conv1d = getattr(utils, "Conv1D", None)
    return conv1d is not None and isinstance(module, conv1d) and type(module).forward is conv1d.forward


def is_linear_subclass(module: nn.Module) -> bool:
    """An nn.Linear subclass whose own forward computes ``F.linear(x, weight, bias)`` (Falcon's ``x @ W.T + b``),
    probed bit for bit in float64 on a small copy."""
    if not isinstance(module, nn.Linear) or type(module).forward is nn.Linear.forward or module.weight.is_meta:
        return False
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, module.in_features, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 5, module.in_features, generator=gen, dtype=torch.float64)
    probe = copy.copy(module)
    probe._parameters = {"weight": nn.Parameter(w, requires_grad=False), "bias": None if module.bias is None else
                         nn.Parameter(torch.randn(3, generator=gen, dtype=torch.float64), requires_grad=False)}
    probe._forward_hooks, probe._forward_pre_hooks = type(module._forward_hooks)(), type(module._forward_pre_hooks)()
    try:
        with torch.no_grad():
            y = probe(x)
    except Exception:  # another signature: not this form
        return False
    expected = F.linear(x, w, probe._parameters["bias"])
    return isinstance(y, torch.Tensor) and y.shape == expected.shape and torch.allclose(y, expected, rtol=1e-12,
                                                                                       atol=1e-12)


def is_scaled_embedding(module: nn.Module) -> bool:
    """An nn.Embedding subclass computing ``F.embedding(ids, weight, padding_idx) * embed_scale`` (probed on a
    small table), the scale a number or a one-element tensor."""
    scale = getattr(module, "embed_scale", None)
    if (not isinstance(module, nn.Embedding) or type(module).forward is nn.Embedding.forward or module.max_norm
            or not (isinstance(scale, (int, float)) or isinstance(scale, torch.Tensor) and scale.numel() == 1)
            or module.weight.device.type == "meta"):
        return False
    gen = torch.Generator().manual_seed(0)
    rows = max(8, (module.padding_idx or 0) + 1)
    table = torch.randn(rows, module.embedding_dim, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, rows, (2, 5), generator=gen)
    y = probe(module, table, ids, torch.float64)
    expected = F.embedding(ids, table, module.padding_idx) * (torch.as_tensor(scale).double())
    return isinstance(y, torch.Tensor) and y.shape == expected.shape and torch.allclose(y.double(), expected,
                                                                                       rtol=1e-6, atol=1e-9)


def _adopt_conv1d(module: nn.Module, found, kind: Kind, options: ConversionOptions) -> nn.Module:
    nx, nf = module.weight.shape
    swap_class(module, PerturbedConv1D, "Perturbed")
    module.init_perturbation(kind, options.directions, {"weight": Geometry(nf, nx)}, "linear",
                             transposed=frozenset({"weight"}))
    return module


def _adopt_linear(module: nn.Module, found, kind: Kind, options: ConversionOptions) -> nn.Module:
    swap_class(module, PerturbedLinear, "Perturbed")  # its own class kept: the plain path is its own forward
    geometry = Geometry(module.out_features, module.in_features)
    module.init_perturbation(kind, options.directions, {"weight": geometry}, "linear")
    return module


def _adopt_scaled_embedding(module: nn.Module, found, kind: Kind, options: ConversionOptions) -> nn.Module:
    swap_class(module, PerturbedScaledEmbedding, "Perturbed")
    geometry = Geometry(module.num_embeddings, module.embedding_dim)
    module.init_perturbation(kind, options.directions, {"weight": geometry}, "embedding")
    return module


HF_FORMS = [Form("conv1d", is_conv1d, _adopt_conv1d, "linear"),
            Form("linear", is_linear_subclass, _adopt_linear, "linear"),
            Form("scaled_embedding", is_scaled_embedding, _adopt_scaled_embedding, "embedding")]
