"""The RMSNorm classes of every transformers family (LlamaRMSNorm, Qwen3RMSNorm's q_norm/k_norm, Gemma's
``(1 + weight)`` form, ...): recognised by name, then by a probe of the module's own forward, which also tells
where it takes its product (in the input's dtype, in float32, or promoted); a norm of another form takes the
exact fallback."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import nn

from ..kinds import Gaussian, Kind
from .base import PerturbedModule
from .form import ConversionOptions, Form
from .layout import PopulationCall
from .plan import rows_first
from .probing import probe
from .swap import swap_class


class PerturbedHFRMSNorm(PerturbedModule):
    """An RMSNorm class of ``transformers`` with a per-member weight: ``x / rms(x) * (offset + w)``,
    normalised in float32 as the library does, then cast back to the input's dtype.

    Shape: population input (R * D, *, C) -> the same shape.
    """

    ROW_WISE = True
    PLANNED = True

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        pop = self.population_of(x.shape[0], self.weight.dtype, x.device)  # members in the weight's dtype
        w = self.member_values("weight", pop, self.weight.dtype)
        return self._normalised(x, w.view(w.shape[0], w.shape[1], 1, x.shape[-1]), pop)

    def _normalised(self, x: torch.Tensor, w: torch.Tensor, pop: PopulationCall) -> torch.Tensor:
        """x (R * D, ..., C) normalised and times its member's weight w (R, D, 1, C), the offset added (a frozen
        weight: (1, 1, 1, C))."""
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.rms_eps)).contiguous()  # x may be a strided view
        h4 = h.view(pop.repeats, pop.directions, -1, x.shape[-1])
        if self.rms_product == "input":  # Llama's: normalised, cast back to the input's dtype, then the product
            return (h4.to(x.dtype) * (w + self.rms_offset if self.rms_offset else w)).view(x.shape)
        # Gemma's product in float32; Olmo2's in the promoted dtype
        scale = w.float() + self.rms_offset if self.rms_product == "float32" else w + self.rms_offset
        return (h4 * scale).to(x.dtype).view(x.shape)

    def call_plan(self, x: torch.Tensor, layout) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A decode step's norm: the member weights' product with the noise and sigma bound (the weight read at
        every call), then :meth:`_normalised`, as :meth:`population_forward` computes them."""
        params, d, state = self._parameters, self.local_directions, self.perturbation
        weight = params["weight"]
        if (state.borrowed or state.noise is None or not rows_first(x, layout, d, state.active.antithetic)
                or x.shape[-1] != weight.shape[0]):
            return None
        pop = self.population_of(x.shape[0], weight.dtype, x.device)
        noise = self.noise_of("weight", weight.dtype)
        if noise is None:
            return None
        z, scale, shape = noise["z"].unsqueeze(0), pop.scale.view(-1, 1, 1), (pop.repeats, d, 1, weight.shape[0])

        def run(x: torch.Tensor) -> torch.Tensor:
            p = params["weight"]  # as member_values: theta + scale_r z_d
            return self._normalised(x, torch.addcmul(p.view(1, 1, -1), z, scale).view(shape), pop)

        return run

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, eps={self.rms_eps}, offset={self.rms_offset}, product={self.rms_product!r}"


class RMSForm(NamedTuple):
    """An RMSNorm's form: ``(offset + w) * x / rms(x)``, normalised in float32, the product taken in the input's
    dtype (``"input"``: cast back first, Llama's order), in float32 (``"float32"``: Gemma's ``w.float()``) or in
    the promoted dtype of float32 and the weight's (``"promoted"``: Olmo2's), then cast to the input's dtype."""

    offset: float
    product: str


def rms_norm_form(module: nn.Module) -> RMSForm | None:
    """The form of ``module`` when it is an RMSNorm (checked on its own forward: the offset in float64 with
    random weights and inputs, the order of the product bit for bit in bfloat16), else None."""
    params = dict(module.named_parameters())
    if "rmsnorm" not in type(module).__name__.lower() or list(params) != ["weight"] or list(module.children()):
        return None
    weight, eps = params["weight"], getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if weight.dim() != 1 or not isinstance(eps, float) or weight.device.type == "meta":
        return None
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(weight.numel(), generator=gen, dtype=torch.float64)
    x = 3 * torch.randn(3, 2, weight.numel(), generator=gen, dtype=torch.float64)
    y = probe(module, w, x)
    normalised = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    for offset in (0.0, 1.0):  # the library normalises in float32: compare at its precision
        if isinstance(y, torch.Tensor) and y.shape == x.shape and torch.allclose(
                y.double(), normalised * (offset + w), rtol=1e-5, atol=1e-6):
            return RMSForm(offset, _rms_product(module, offset, eps, w, x, y))
    return None


def _rms_product(module: nn.Module, offset: float, eps: float, w: torch.Tensor, x: torch.Tensor,
                 y: torch.Tensor) -> str:
    """Where an RMSNorm takes its product, told apart bit for bit: in float64 (float32 vs the rest), then in
    bfloat16 (the input's dtype vs the promoted one)."""
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if torch.equal(y, (h * (w.float() + offset)).to(x.dtype)):
        return "float32"
    w16, x16 = w.bfloat16(), x.bfloat16()
    h = x16.float() * torch.rsqrt(x16.float().pow(2).mean(-1, keepdim=True) + eps)
    y16 = probe(module, w16, x16)
    return "input" if isinstance(y16, torch.Tensor) and torch.equal(y16, h.to(torch.bfloat16) * (w16 + offset)) else (
        "promoted")


def _adopt_rms_norm(module: nn.Module, found: RMSForm, kind: Kind, options: ConversionOptions) -> nn.Module:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    swap_class(module, PerturbedHFRMSNorm, "Perturbed")
    module.rms_eps, module.rms_offset, module.rms_product = float(eps), *found
    module.init_perturbation(Gaussian(), options.directions, {}, "elementwise")
    return module


HF_FORMS = [Form("rms_norm", rms_norm_form, _adopt_rms_norm, None)]
