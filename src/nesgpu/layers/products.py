"""The perturbed linear product of a module's matrix and bias: the kind's fused GEMM where it has one, else the
shared product plus the kind's noise; and its plan for a decode step (:mod:`nesgpu.layers.plan`).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..kinds import LINEAR
from .layout import PopulationCall, RowLayout, rows_view
from .plan import rows_first


class LinearProducts:
    """Mixin of :class:`nesgpu.layers.base.PerturbedModule`: the linear products of its matrices."""

    def linear_plan(self, x: torch.Tensor, layout: RowLayout | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The plan of a call whose population forward is ``perturbed_linear(x, pop, "weight", "bias")`` (Linear,
        Conv1D) on ``x`` (rows first, contiguous, the weight's dtype, no autocast, a kind with a fused product), or
        None."""
        state = self.perturbation
        params, transposed = self._parameters, "weight" in state.transposed
        w = params["weight"]
        d = self.local_directions
        if (state.borrowed or state.noise is None or not rows_first(x, layout, d, state.active.antithetic)
                or x.dtype != w.dtype or x.shape[-1] != w.shape[0 if transposed else 1] or not x.is_contiguous()
                or torch.is_autocast_enabled(x.device.type)):
            return None
        pop = self.population_of(x.shape[0], x.dtype, x.device)
        noise = self.noise_of("weight", x.dtype)
        bias_noise = None if params.get("bias") is None else self.noise_of("bias", x.dtype)
        product = None if noise is None else self.slot_of("weight").kind.linear_plan(
            pop.signed, noise, None if bias_noise is None else bias_noise["z"])
        if product is None:
            return None
        rows4, out = (pop.repeats, d, -1, x.shape[-1]), (*x.shape[:-1], w.shape[1 if transposed else 0])

        def run(x: torch.Tensor) -> torch.Tensor:
            w = params["weight"]
            return product(x.view(rows4), w if transposed else w.t(), params.get("bias")).view(out)

        return run

    def perturbed_linear(self, x: torch.Tensor, pop: PopulationCall, weight: str, bias: str | None,
                          part: slice | None = None, y: torch.Tensor | None = None) -> torch.Tensor:
        """x (R * D, ..., in) through matrix ``weight`` and vector ``bias`` (rows ``part`` of it), both perturbed.
        ``y``, when given, is the shared (unperturbed) product with the bias, computed by the caller (a
        low-bit layer's); the noise is added to it in place."""
        b = None if bias is None else getattr(self, bias)
        w = getattr(self, weight)
        w = w.t() if weight in self.perturbation.transposed else w  # (out, in)
        if y is None:
            fused = None if part or torch.is_autocast_enabled(x.device.type) else self._fused_linear(x, pop, weight,
                                                                                                     bias, w, b)
            if fused is not None:
                return fused
            y = F.linear(x, w, b if b is None or part is None else b[part])
        y4 = rows_view(y, pop.repeats, pop.directions)
        noise = self.noise_of(weight, y.dtype)
        if noise is None:  # a frozen weight
            if b is not None:
                self.add_vector_(bias, LINEAR, y4, pop.scale, part)
            return y
        bias_noise = None if b is None else self.noise_of(bias, y.dtype)
        bias_z = None if bias_noise is None else bias_noise["z"] if part is None else bias_noise["z"][:, part]
        x4 = rows_view(x.to(y.dtype), pop.repeats, pop.directions)
        self.slot_of(weight).kind.apply_with_bias_(LINEAR, x4, y4, pop.scale, noise, bias_z)  # may fold the bias in
        return y

    def _fused_linear(self, x, pop, weight, bias, w, b) -> torch.Tensor | None:
        """The whole perturbed product in one GEMM where the kind has one (Kind.linear_product), else None."""
        noise = self.noise_of(weight, x.dtype)
        if noise is None or x.dtype != w.dtype or not x.is_contiguous():
            return None
        bias_noise = None if b is None else self.noise_of(bias, x.dtype)
        x4 = rows_view(x, pop.repeats, pop.directions)
        y4 = self.slot_of(weight).kind.linear_product(x4, w.t(), b, pop.signed, noise,
                                                    None if bias_noise is None else bias_noise["z"])
        return None if y4 is None else y4.view(*x.shape[:-1], w.shape[0])
