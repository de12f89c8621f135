"""IID Gaussian noise: every direction has its own dense noise tensor. The exact reference kind.

It perturbs a parameter of any shape: matrices through the op's per-direction product, vectors (biases,
norm scales) and any other parameter elementwise. Noise memory: D * numel per parameter.

It takes a scale per entry (a sigma per parameter: SNES, separable CMA-ES): :meth:`Gaussian.scale_` multiplies
the drawn z_d by S in place, so the record holds S o z_d and every product reads it unchanged, and
:func:`weighted_squares` recovers the unit z_d = (S o z_d) / S for the adaptation's statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Kind, Noise, randn

STATISTIC_BLOCK = 1 << 22
"""Entries :func:`weighted_squares` squares at once (16 MiB in float32): its one temporary, whatever D."""


def weighted_squares(z: torch.Tensor, weights: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """sum_d w_d (u_d o u_d - 1), u_d = z_d / scale (z_d as it is without a scale), for z (D, *shape) and
    weights (D,) of z's dtype and device: a tensor of ``shape``. Blocks of directions are squared in turn, so
    the extra memory is one block of at most max(numel, :data:`STATISTIC_BLOCK`) entries, never (D, numel);
    no host read."""
    d, numel = z.shape[0], max(1, z[0].numel())
    rows = max(1, min(d, STATISTIC_BLOCK // numel))
    total = z.new_zeros(z.shape[1:])
    flat = total.view(-1)
    for a in range(0, d, rows):
        block = z[a:a + rows].square() if scale is None else z[a:a + rows].div(scale).square_()
        flat.addmv_(block.view(block.shape[0], -1).t(), weights[a:a + rows])  # += sum_d w_d u_d o u_d
    return total.sub_(weights.sum())


@dataclass(frozen=True)
class Gaussian(Kind):
    """z_d: a tensor of IID unit Gaussians of the parameter's shape, per direction."""

    name = "gaussian"
    products = frozenset({"linear", "conv", "embedding", "experts"})
    per_element_scale = True

    def draw_directions(self, gen, n, geometry, like):
        return {"z": randn(like, n, *like.shape, gen=gen)}

    def allocate_directions(self, n, geometry, like):
        return {"z": like.new_empty((n, *like.shape))}

    def fill_directions(self, gen, out, geometry):
        out["z"].normal_(generator=gen)  # what torch.randn does: the same values, without a copy

    def apply_(self, op, x, y, scale, noise):
        delta = op.per_direction(x, noise["z"], noise.geometry.groups)
        y.addcmul_(delta, op.per_repeat(scale, y))

    def embed_(self, index, y, scale, noise):
        d = noise.directions
        rows = noise["z"][torch.arange(d, device=index.device).view(1, d, 1), index]  # (R, D, M, dim)
        y.addcmul_(rows, scale.view(-1, 1, 1, 1))

    def experts_(self, x, y, scale, direction, noise, expert):
        g = noise.geometry
        z = noise["z"].view(-1, g.groups, g.out // g.groups, g.in_ // g.groups)[direction, expert]  # (M, out, in)
        y.addcmul_(torch.bmm(z, x.unsqueeze(-1)).squeeze(-1), scale.unsqueeze(-1))

    def zero_rows_(self, noise, row):
        noise["z"][:, row] = 0

    def grad(self, noise: Noise, coef):
        return torch.tensordot(coef, noise["z"], dims=1)

    def dense(self, noise):
        return noise["z"]

    def sq_norms(self, noise):
        return noise["z"].pow(2).flatten(1).sum(1)

    def scale_(self, noise, scale):
        noise["z"].mul_(scale)  # once per draw; apply_, embed_, experts_, grad, dense then see S o z_d as drawn

    def scale_statistic(self, noise, scale, weights, first=False):
        if first:  # sum_d w_d u_d: what the update sums, S taken out again
            total = torch.tensordot(weights, noise["z"], dims=1)
            return total if scale is None else total.div_(scale)
        return weighted_squares(noise["z"], weights, scale)
