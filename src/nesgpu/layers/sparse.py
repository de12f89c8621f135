"""Sparse Gaussian noise: each direction perturbs only k random input columns.

The k nonzero columns of z_d are Gaussian scaled by sqrt(in / k), so every entry of z_d still has unit
variance and zero covariance with the others: the estimator stays unbiased, at the price of more
variance as k shrinks. Noise memory per layer: D * out * k values plus D * k column indices.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..noise import random_subsets
from .base import PerturbedLinearBase, resolve_count


def sparse_linear_delta(x: torch.Tensor, columns: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """x (R, D, in), columns (D, k), values (D, out, k) -> (R, D, out): gather k inputs, small bmm."""
    r = x.shape[0]
    picked = x.gather(2, columns.unsqueeze(0).expand(r, -1, -1))
    return torch.einsum("rdk,dok->rdo", picked, values)


class SparsePerturbedLinear(PerturbedLinearBase, nn.Linear):
    """nn.Linear whose direction d perturbs only ``k`` of the input columns.

    Args:
        in_features, out_features, bias, device, dtype: as for :class:`torch.nn.Linear`.
        directions: population size D.
        k: perturbed input columns per direction, a count or a fraction of ``in_features``
            (default: ``min(8, in_features)``).
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None, k=None):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._init_perturbation(directions)
        self.k = resolve_count(min(8, in_features) if k is None else k, in_features, "k")

    def _draw_directions(self, gen, n):
        columns = random_subsets(self.in_features, 1, self.k, n, gen, self.weight.device)
        values = self._randn(n, self.out_features, self.k, gen=gen).mul_(math.sqrt(self.in_features / self.k))
        return {"columns": columns, "values": values}

    def _add_weight_perturbation(self, x, y, scale, noise):
        delta = sparse_linear_delta(x, noise["columns"], noise["values"])
        y.addcmul_(delta, scale.view(-1, 1, 1))

    def _weight_grad(self, coef):
        columns, values = self._noise["columns"], self._noise["values"]
        d, out, k = values.shape
        src = (values * coef.view(d, 1, 1)).permute(1, 0, 2).reshape(out, d * k)
        grad = torch.zeros_like(self.weight)
        return grad.scatter_add_(1, columns.reshape(1, d * k).expand(out, -1), src)

    def _dense_weight_noise(self):
        columns, values = self._noise["columns"], self._noise["values"]
        d, out, k = values.shape
        dense = values.new_zeros(d, out, self.in_features)
        return dense.scatter_(2, columns.unsqueeze(1).expand(d, out, k), values)

    def _weight_sq_norms(self):
        return self._noise["values"].pow(2).flatten(1).sum(1)

    def _options_repr(self) -> str:
        return f", k={self.k}"
