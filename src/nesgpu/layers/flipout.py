"""Flip-out noise (Wen et al. 2018, "Flipout"; NESgpu called it "Synthetic").

All directions share one Gaussian tensor E; direction d flips its signs with random +-1 vectors on the
inputs (a_d) and/or outputs (b_d): ``z_d = E * (b_d a_d^T)``. Each z_d is a matrix of IID unit Gaussians.
The forward is one extra GEMM: ``((x * a_d) E^T) * b_d``.

For convolutions a_d flips input channels and b_d output channels.
Noise memory per layer: E plus D * (in + out) signs.
"""

from __future__ import annotations

import torch
from torch import nn

from ..noise import random_signs
from .base import PerturbedConv2dBase, PerturbedLayer, PerturbedLinearBase

SIGNS = ("both", "in", "out")


class _FlipoutMixin(PerturbedLayer):
    def _init_flipout(self, directions, signs):
        self._init_perturbation(directions)
        if signs not in SIGNS:
            raise ValueError(f"signs must be one of {SIGNS}; got {signs!r}")
        self.signs = signs

    def _draw_shared(self, gen):
        return {"shared": self._randn(*self.weight.shape, gen=gen)}

    def _draw_directions(self, gen, n):
        n_out, n_in, _, _ = self.geometry
        device, dtype, out = self.weight.device, self.weight.dtype, {}
        if self.signs in ("both", "in"):
            out["in_signs"] = random_signs(n, n_in, gen, device, dtype)
        if self.signs in ("both", "out"):
            out["out_signs"] = random_signs(n, n_out, gen, device, dtype)
        return out

    def _signs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) of shapes (D, in) and (D, out); a side without signs is all ones."""
        n_out, n_in, _, _ = self.geometry
        d, noise, w = self.local_directions, self._noise, self.weight
        a = noise.get("in_signs", w.new_ones(1, 1).expand(d, n_in))
        b = noise.get("out_signs", w.new_ones(1, 1).expand(d, n_out))
        return a, b

    def _add_weight_perturbation(self, x, y, scale, noise):
        trailing = (1,) * (x.dim() - 3)
        r, d = x.shape[:2]
        row_scale = scale.view(r, 1, 1, *trailing)
        if "in_signs" in noise:  # one pass over x: fold the repeat scale into the signs first
            x = x * (noise["in_signs"].view(1, d, -1, *trailing) * row_scale)
        h = self._apply_shared(x, noise["shared"], self.geometry[2])
        if "in_signs" not in noise:
            h.mul_(row_scale)
        if "out_signs" in noise:
            y.addcmul_(h, noise["out_signs"].view(1, d, -1, *trailing))
        else:
            y.add_(h)

    def _sign_products(self, coef: torch.Tensor | None) -> torch.Tensor:
        """(D, out, in_g) of b_d[o] * a_d[g(o), c] (times coef_d when given; then summed over D)."""
        n_out, n_in, groups, _ = self.geometry
        a, b = self._signs()
        d = a.shape[0]
        a = a.reshape(d, groups, n_in // groups)
        b = b.reshape(d, groups, n_out // groups)
        if coef is None:
            return torch.einsum("dgo,dgc->dgoc", b, a).reshape(d, n_out, n_in // groups)
        return torch.einsum("dgo,dgc->goc", b * coef.view(d, 1, 1), a).reshape(n_out, n_in // groups)

    def _weight_grad(self, coef):
        trailing = (1,) * (self.weight.dim() - 2)
        return self._noise["shared"] * self._sign_products(coef).view(*self.weight.shape[:2], *trailing)

    def _dense_weight_noise(self):
        trailing = (1,) * (self.weight.dim() - 2)
        products = self._sign_products(None)
        return self._noise["shared"].unsqueeze(0) * products.view(*products.shape, *trailing)

    def _weight_sq_norms(self):
        # every direction uses all of E, moved or sign-flipped: the same norm for all
        return self._noise["shared"].pow(2).sum().expand(self.local_directions)

    def _options_repr(self) -> str:
        return f", signs={self.signs!r}"


class FlipoutLinear(_FlipoutMixin, PerturbedLinearBase, nn.Linear):
    """nn.Linear whose directions share one Gaussian noise matrix under per-direction sign flips.

    Args:
        in_features, out_features, bias, device, dtype: as for :class:`torch.nn.Linear`.
        directions: population size D.
        signs: flip "both" sides (default), only "in"puts or only "out"puts.

    Shape:
        population input (R * D, ..., in) -> (R * D, ..., out); row n uses direction n % D.
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None,
                 signs="both"):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._init_flipout(directions, signs)


class FlipoutConv2d(_FlipoutMixin, PerturbedConv2dBase, nn.Conv2d):
    """nn.Conv2d whose directions share one Gaussian kernel under per-direction channel sign flips.

    Args:
        as for :class:`torch.nn.Conv2d`, plus ``directions`` and ``signs`` (see :class:`FlipoutLinear`).

    Shape:
        population input (R * D, C_in, H, W) -> (R * D, C_out, H_out, W_out).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, *, directions=None, signs="both"):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                           bias, padding_mode, device, dtype)
        self._init_flipout(directions, signs)
