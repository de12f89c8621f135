"""IID Gaussian noise: every direction has its own dense noise tensor. The exact reference kind.

Noise memory per layer: D * out * in (one tensor, shared by both signs with antithetic sampling).
"""

from __future__ import annotations

import torch
from torch import nn

from .base import PerturbedConv2dBase, PerturbedLayer, PerturbedLinearBase


def gaussian_linear_delta(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """x (R, D, in), noise (D, out, in) -> x_{r,d} z_d^T of shape (R, D, out): one batched matmul."""
    return torch.einsum("rdi,doi->rdo", x, noise)


class _DenseNoise(PerturbedLayer):
    """The noise is stored densely, one full weight-shaped tensor per direction: (D, *weight.shape)."""

    def _draw_directions(self, gen, n):
        return {"weight": self._randn(n, *self.weight.shape, gen=gen)}

    def _weight_grad(self, coef):
        return torch.tensordot(coef, self._noise["weight"], dims=1)

    def _dense_weight_noise(self):
        return self._noise["weight"]

    def _weight_sq_norms(self):
        return self._noise["weight"].pow(2).flatten(1).sum(1)


class PerturbedLinear(_DenseNoise, PerturbedLinearBase, nn.Linear):
    """nn.Linear whose population forward adds IID Gaussian weight noise per direction.

    Args:
        in_features, out_features, bias, device, dtype: as for :class:`torch.nn.Linear`.
        directions: population size D (set by :class:`~nesgpu.PerturbedModel` when None).

    Shape:
        population input (R * D, ..., in) -> (R * D, ..., out); row n uses direction n % D.

    Example:
        >>> layer = PerturbedLinear(8, 4, directions=16)
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._init_perturbation(directions)

    def _add_weight_perturbation(self, x, y, scale, noise):
        y.addcmul_(gaussian_linear_delta(x, noise["weight"]), scale.view(-1, 1, 1))


class PerturbedConv2d(_DenseNoise, PerturbedConv2dBase, nn.Conv2d):
    """nn.Conv2d whose population forward adds IID Gaussian weight noise per direction.

    The D per-direction kernels run as one grouped convolution (D * groups groups).

    Args:
        as for :class:`torch.nn.Conv2d`, plus ``directions``.

    Shape:
        population input (R * D, C_in, H, W) -> (R * D, C_out, H_out, W_out).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, *, directions=None):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                           bias, padding_mode, device, dtype)
        self._init_perturbation(directions)

    def _add_weight_perturbation(self, x, y, scale, noise):
        r, d = x.shape[:2]
        noise = noise["weight"]
        delta = self._conv(x.reshape(r, d * self.in_channels, *x.shape[3:]),
                           noise.reshape(d * self.out_channels, *noise.shape[2:]), groups=d * self.groups)
        y.addcmul_(delta.view(y.shape), scale.view(-1, 1, 1, 1, 1))
