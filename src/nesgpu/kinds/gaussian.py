"""IID Gaussian noise: every direction has its own dense noise tensor. The exact reference kind.

It perturbs a parameter of any shape: matrices through the op's per-direction product, vectors (biases,
norm scales) and any other parameter elementwise. Noise memory: D * numel per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Kind, Noise, randn


@dataclass(frozen=True)
class Gaussian(Kind):
    """z_d: a tensor of IID unit Gaussians of the parameter's shape, per direction."""

    name = "gaussian"
    products = frozenset({"linear", "conv", "embedding", "experts"})

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
