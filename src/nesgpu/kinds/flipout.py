"""Flip-out noise (Wen et al. 2018, "Flipout"; NESgpu called it "Synthetic").

All directions share one Gaussian tensor E; direction d flips its signs with random +-1 vectors on the
inputs (a_d) and/or outputs (b_d): ``z_d = E * (b_d a_d^T)``. Each z_d is a matrix of IID unit Gaussians,
and the random signs have zero mean, so the estimator needs no antithetic pairs. The forward is one extra
GEMM: ``((x * a_d) E^T) * b_d``. For convolutions a_d flips input channels and b_d output channels.
Noise memory: E plus D * (in + out) signs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..noise import random_signs
from .base import Kind, randn

SIGNS = ("both", "in", "out")


@dataclass(frozen=True)
class Flipout(Kind):
    """Flip-out noise: one shared noise matrix per step, decorrelated per direction by random sign flips.

    Args:
        signs: flip "both" sides (default), only "in"puts or only "out"puts.
    """

    name = "flipout"
    signs: str = field(default="both", metadata={
        "help": "flip both sides of the product, only the inputs or only the outputs", "choices": SIGNS})

    def __post_init__(self):
        if self.signs not in SIGNS:
            raise ValueError(f"signs must be one of {SIGNS}; got {self.signs!r}")

    def draw_shared(self, gen, geometry, like):
        return {"shared": randn(like, *geometry.shape, gen=gen)}

    def draw_directions(self, gen, n, geometry, like):
        out = {}
        if self.signs in ("both", "in"):
            out["in_signs"] = random_signs(n, geometry.in_, gen, like.device, like.dtype)
        if self.signs in ("both", "out"):
            out["out_signs"] = random_signs(n, geometry.out, gen, like.device, like.dtype)
        return out

    def apply_(self, op, x, y, scale, noise):
        rows = op.per_repeat(scale, x)
        if "in_signs" in noise:  # one pass over x: fold the repeat scale into the signs first
            x = x * (op.per_channel(noise["in_signs"], x) * rows)
        h = op.shared(x, noise["shared"], noise.geometry.groups)
        if "in_signs" not in noise:
            h.mul_(rows)
        if "out_signs" in noise:
            y.addcmul_(h, op.per_channel(noise["out_signs"], h))
        else:
            y.add_(h)

    def _sign_products(self, noise, coef: torch.Tensor | None) -> torch.Tensor:
        """(D, out, in_g) of b_d[o] * a_d[g(o), c] (times coef_d when given; then summed over D)."""
        g, d = noise.geometry, noise.directions
        like = noise["shared"]
        a = noise["in_signs"] if "in_signs" in noise else like.new_ones(1, 1).expand(d, g.in_)
        b = noise["out_signs"] if "out_signs" in noise else like.new_ones(1, 1).expand(d, g.out)
        a = a.reshape(d, g.groups, g.in_ // g.groups)
        b = b.reshape(d, g.groups, g.out // g.groups)
        if coef is None:
            return torch.einsum("dgo,dgc->dgoc", b, a).reshape(d, g.out, g.in_ // g.groups)
        return torch.einsum("dgo,dgc->goc", b * coef.view(d, 1, 1), a).reshape(g.out, g.in_ // g.groups)

    def grad(self, noise, coef):
        trailing = (1,) * len(noise.geometry.kernel)
        return noise["shared"] * self._sign_products(noise, coef).view(*noise.geometry.shape[:2], *trailing)

    def dense(self, noise):
        trailing = (1,) * len(noise.geometry.kernel)
        products = self._sign_products(noise, None)
        return noise["shared"].unsqueeze(0) * products.view(*products.shape, *trailing)

    def sq_norms(self, noise):
        # every direction uses all of E, sign-flipped: the same norm for all
        return noise["shared"].pow(2).sum().expand(noise.directions)
