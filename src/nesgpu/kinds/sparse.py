"""Sparse Gaussian noise: each direction perturbs only k random input columns of a matrix.

The k nonzero columns of z_d are Gaussian scaled by sqrt(in / k), so every entry of z_d still has unit
variance and zero covariance with the others: the estimator stays unbiased, at the price of more
variance as k shrinks. Linear products only. Noise memory: D * out * k values plus D * k column indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..noise import random_subsets
from .base import Kind, randn
from .counts import resolve_count


@dataclass(frozen=True)
class Sparse(Kind):
    """Sparse noise: each direction perturbs k random input columns of the weight.

    Args:
        k: perturbed input columns per direction, a count (int) or a fraction (float) of ``in`` (default:
            ``min(8, in)``).
    """

    name = "sparse"
    products = frozenset({"linear"})
    k: int | float | None = field(default=None, metadata={
        "help": "perturbed input columns per direction: a count, or a fraction of the inputs (default min(8, in))"})

    def __post_init__(self):
        if self.k is not None:
            resolve_count(self.k, 1 << 62, "k")  # type and range checks; the bound is the layer's

    def check(self, geometry):
        self.columns(geometry.in_)

    def columns(self, in_features: int) -> int:
        return resolve_count(min(8, in_features) if self.k is None else self.k, in_features, "k")

    def draw_directions(self, gen, n, geometry, like):
        k = self.columns(geometry.in_)
        columns = random_subsets(geometry.in_, 1, k, n, gen, like.device)
        values = randn(like, n, geometry.out, k, gen=gen).mul_(math.sqrt(geometry.in_ / k))
        return {"columns": columns, "values": values}

    def apply_(self, op, x, y, scale, noise):
        picked = op.gather_channels(x, noise["columns"])  # (R, D, M, k)
        delta = torch.einsum("rdmk,dok->rdmo", picked, noise["values"])
        y.addcmul_(delta, op.per_repeat(scale, y))

    def grad(self, noise, coef):
        columns, values = noise["columns"], noise["values"]
        d, out, k = values.shape
        src = (values * coef.view(d, 1, 1)).permute(1, 0, 2).reshape(out, d * k)
        grad = values.new_zeros(noise.shape)
        return grad.scatter_add_(1, columns.reshape(1, d * k).expand(out, -1), src)

    def dense(self, noise):
        columns, values = noise["columns"], noise["values"]
        d, out, k = values.shape
        dense = values.new_zeros(d, *noise.shape)
        return dense.scatter_(2, columns.unsqueeze(1).expand(d, out, k), values)

    def sq_norms(self, noise):
        return noise["values"].pow(2).flatten(1).sum(1)
