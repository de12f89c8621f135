"""Low-rank noise (EGGROLL, arXiv 2511.16652): direction d's noise is ``z_d = A_d B_d^T / sqrt(r)``.

A_d (out x r) and B_d (in x r) are unit Gaussians; dividing by sqrt(r) gives every entry of z_d unit
variance, and E[z_d z_d^T] = I entrywise, so the estimator is unbiased. The forward never builds a
per-direction weight: it applies ``(x B_d) A_d^T``, two thin batched matmuls.

Convolution factorisation: the kernel (out, C/g, kh, kw) is treated as a matrix of out rows by
(C/g * kh * kw) columns, per channel group. B_d is r full-size filters (r, C/g, kh, kw) per group and
A_d mixes those r feature maps into the out channels (a per-direction 1x1 convolution). The forward is a
grouped convolution with D * groups * r filters followed by a batched (r -> out) mix.

Noise memory per layer: D * r * (out + in * kh * kw) values.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import PerturbedConv2dBase, PerturbedLinearBase


def add_lowrank_linear_(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                        scale: torch.Tensor) -> None:
    """y (R, D, out) += scale_r (x_{r,d} b_d^T) a_d, with x (R, D, in), a (D, r, out), b (D, r, in).

    Low ranks take r fused elementwise passes (x . b_dk, then y += t * a_dk): on the CPU these beat a
    batched matmul whose D batches are matrix-vector products. High ranks use two batched matmuls.
    """
    rank = a.shape[1]
    if rank <= _ELEMENTWISE_MAX_RANK:
        row_scale = scale.view(-1, 1, 1)
        for k in range(rank):
            t = (x * b[:, k]).sum(-1, keepdim=True).mul_(row_scale)  # (R, D, 1)
            y.addcmul_(t, a[:, k])
        return
    t = torch.einsum("rdi,dki->rdk", x, b).mul_(scale.view(-1, 1, 1))
    y.add_(torch.einsum("rdk,dko->rdo", t, a))


_ELEMENTWISE_MAX_RANK = 4


class LowRankLinear(PerturbedLinearBase, nn.Linear):
    """nn.Linear with per-direction rank-r noise A_d B_d^T / sqrt(r), applied as (x B_d) A_d^T.

    Args:
        in_features, out_features, bias, device, dtype: as for :class:`torch.nn.Linear`.
        directions: population size D.
        rank: r, the rank of each direction's noise (default 1).

    Shape:
        population input (R * D, ..., in) -> (R * D, ..., out); row n uses direction n % D.
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None, rank=1):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._init_perturbation(directions)
        self.rank = _check_rank(rank)

    # a (D, r, out) and b (D, r, in): each rank-one factor is a contiguous row
    def _draw_directions(self, gen, n):
        a = self._randn(n, self.rank, self.out_features, gen=gen).div_(math.sqrt(self.rank))
        b = self._randn(n, self.rank, self.in_features, gen=gen)
        return {"a": a, "b": b}

    def _add_weight_perturbation(self, x, y, scale, noise):
        add_lowrank_linear_(y, x, noise["a"], noise["b"], scale)

    def _weight_grad(self, coef):
        a, b = self._noise["a"], self._noise["b"]
        d, r, out = a.shape
        # sum_d coef_d a_d^T b_d as one GEMM over the D * r rank-one factors
        return (a * coef.view(d, 1, 1)).reshape(d * r, out).t() @ b.reshape(d * r, self.in_features)

    def _dense_weight_noise(self):
        return self._noise["a"].transpose(1, 2) @ self._noise["b"]

    def _weight_sq_norms(self):
        # ||sum_k a_k b_k^T||^2 = sum_{k,l} (a_k . a_l)(b_k . b_l)
        a, b = self._noise["a"], self._noise["b"]
        return ((a @ a.transpose(1, 2)) * (b @ b.transpose(1, 2))).sum((1, 2))

    def _options_repr(self) -> str:
        return f", rank={self.rank}"


class LowRankConv2d(PerturbedConv2dBase, nn.Conv2d):
    """nn.Conv2d with per-direction rank-r noise, applied as a grouped convolution and a 1x1 mix.

    See the module docstring for the factorisation.

    Args:
        as for :class:`torch.nn.Conv2d`, plus ``directions`` and ``rank`` (default 1).

    Shape:
        population input (R * D, C_in, H, W) -> (R * D, C_out, H_out, W_out).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, *, directions=None, rank=1):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                           bias, padding_mode, device, dtype)
        self._init_perturbation(directions)
        self.rank = _check_rank(rank)

    def _draw_directions(self, gen, n):
        g, r = self.groups, self.rank
        a = self._randn(n, g, self.out_channels // g, r, gen=gen).div_(math.sqrt(r))
        b = self._randn(n, g, r, *self.weight.shape[1:], gen=gen)
        return {"a": a, "b": b}

    def _add_weight_perturbation(self, x, y, scale, noise):
        a, b = noise["a"], noise["b"]
        r_, d = x.shape[:2]
        filters = b.reshape(d * self.groups * self.rank, *b.shape[3:])
        t = self._conv(x.reshape(r_, d * self.in_channels, *x.shape[3:]), filters, groups=d * self.groups)
        t = t.view(r_, d, self.groups, self.rank, -1).mul_(scale.view(-1, 1, 1, 1, 1))
        y_groups = y.view(r_, d, self.groups, self.out_channels // self.groups, -1)
        if self.rank <= _ELEMENTWISE_MAX_RANK:  # r fused passes over y, no temporary
            for k in range(self.rank):
                y_groups.addcmul_(t[:, :, :, k : k + 1], a[..., k].unsqueeze(-1))
        else:
            y_groups.add_(torch.einsum("rdgkp,dgok->rdgop", t, a))

    def _weight_grad(self, coef):
        a, b = self._noise["a"], self._noise["b"]
        d = coef.shape[0]
        g = torch.einsum("dgok,dgkf->gof", a * coef.view(d, 1, 1, 1), b.flatten(3))
        return g.reshape(self.weight.shape)

    def _dense_weight_noise(self):
        a, b = self._noise["a"], self._noise["b"]
        d = a.shape[0]
        return torch.einsum("dgok,dgkf->dgof", a, b.flatten(3)).reshape(d, *self.weight.shape)

    def _weight_sq_norms(self):
        a, b = self._noise["a"], self._noise["b"].flatten(3)  # (D, G, out_g, r), (D, G, r, F)
        return ((a.transpose(2, 3) @ a) * (b @ b.transpose(2, 3))).sum((1, 2, 3))

    def _options_repr(self) -> str:
        return f", rank={self.rank}"


def _check_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive int; got {rank!r}")
    return rank
