"""Permuted noise: one shared Gaussian tensor E, which each direction uses under its own permutation.

Direction d's noise places E's rows at output positions rho_d and E's columns at input positions pi_d:
``z_d[rho_d[i], pi_d[j]] = E[i, j]``. With sparsity, rho_d / pi_d pick only k of the rows / columns, and E
is scaled by sqrt(n / k) on that side so every entry of z_d keeps unit variance. Each z_d is a matrix of
IID unit Gaussians; directions are weakly correlated (two directions share an entry with probability
1/n per permuted side).

The forward is one extra GEMM with E: gather the inputs (in-permutation), multiply, scatter-add the
outputs (out-permutation). For convolutions, permutations stay inside each channel group, and the
in-permutation permutes input channels (the kernel's spatial layout is kept).

Noise memory per layer: E (k_out x k_in x kernel) plus D * (k_in + k_out) indices.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..noise import random_subsets
from .base import PerturbedConv2dBase, PerturbedLayer, PerturbedLinearBase, resolve_count

PERMUTATIONS = ("in", "out", "both", "auto")


def gather_channels(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (R, D, C, ...) -> (R, D, K, ...): row (r, d) keeps channels index[d] (index of shape (D, K))."""
    r, d, k = x.shape[0], index.shape[0], index.shape[1]
    if x.dim() == 3:
        return x.gather(2, index.unsqueeze(0).expand(r, d, k))
    # feature maps: copy whole contiguous (H, W) planes, much faster than an elementwise gather
    rows = _plane_index(index, r, x.shape[2])
    return x.reshape(-1, *x.shape[3:]).index_select(0, rows).view(r, d, k, *x.shape[3:])


def scatter_add_channels_(y: torch.Tensor, index: torch.Tensor, h: torch.Tensor) -> None:
    """y (R, D, C, ...) += h (R, D, K, ...) placed at channels index[d] (index of shape (D, K))."""
    r, d, k = h.shape[0], index.shape[0], index.shape[1]
    if y.dim() == 3:
        y.scatter_add_(2, index.unsqueeze(0).expand(r, d, k), h)
        return
    rows = _plane_index(index, r, y.shape[2])
    y.view(-1, *y.shape[3:]).index_add_(0, rows, h.reshape(-1, *h.shape[3:]))


def _plane_index(index: torch.Tensor, repeats: int, channels: int) -> torch.Tensor:
    d = index.shape[0]
    first = torch.arange(repeats * d, device=index.device).mul_(channels).view(repeats, d, 1)
    return (first + index.unsqueeze(0)).reshape(-1)


class _PermutedMixin(PerturbedLayer):
    def _init_permuted(self, directions, permutation, in_sparsity, out_sparsity):
        self._init_perturbation(directions)
        if permutation not in PERMUTATIONS:
            raise ValueError(f"permutation must be one of {PERMUTATIONS}; got {permutation!r}")
        n_out, n_in, groups, _ = self.geometry
        self.k_out = resolve_count(out_sparsity, n_out // groups, "out_sparsity")  # per group
        self.k_in = resolve_count(in_sparsity, n_in // groups, "in_sparsity")  # per group
        sparse_out, sparse_in = self.k_out < n_out // groups, self.k_in < n_in // groups
        if permutation == "auto":  # sparse sides must be index-selected; else permute the larger side
            if sparse_in or sparse_out:
                permutation = "both" if sparse_in and sparse_out else ("in" if sparse_in else "out")
            else:
                permutation = "in" if n_in // groups >= n_out // groups else "out"
        self.permutation = permutation
        self.permute_in = permutation in ("in", "both") or sparse_in
        self.permute_out = permutation in ("out", "both") or sparse_out

    def _draw_shared(self, gen):
        n_out, n_in, groups, kernel = self.geometry
        shape = (groups * self.k_out, self.k_in, *kernel)
        gain = math.sqrt((n_out // groups) / self.k_out * (n_in // groups) / self.k_in)
        return {"shared": self._randn(*shape, gen=gen).mul_(gain)}

    def _draw_directions(self, gen, n):
        n_out, n_in, groups, _ = self.geometry
        device, out = self.weight.device, {}
        if self.permute_in:
            out["in_index"] = random_subsets(n_in, groups, self.k_in, n, gen, device)
        if self.permute_out:
            out["out_index"] = random_subsets(n_out, groups, self.k_out, n, gen, device)
        return out

    def _add_weight_perturbation(self, x, y, scale, noise):
        shape = (-1,) + (1,) * (x.dim() - 1)
        if self.permute_in:
            x = gather_channels(x, noise["in_index"]).mul_(scale.view(shape))
        shared = noise["shared"]
        if self.permute_in and not self.permute_out and y.dim() == 3 and x.dtype == y.dtype == shared.dtype:
            # Linear, in-permutation only: accumulate the GEMM straight into y (no temporary)
            y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), shared.t())
            return
        h = self._apply_shared(x, shared, self.geometry[2])
        if not self.permute_in:
            h.mul_(scale.view(shape))
        if self.permute_out:
            scatter_add_channels_(y, noise["out_index"], h)
        else:
            y.add_(h)

    def _flat_index(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """For directions [start, stop): where each entry (i, j) of E lands in z_d viewed as (out * in_g, ...).

        Returns int64 (d, K_out, k_in)."""
        n_out, n_in, groups, _ = self.geometry
        in_g, device = n_in // groups, self.weight.device
        k_total = groups * self.k_out
        d = (stop if stop is not None else self.local_directions) - start
        if self.permute_out:
            rows = self._noise["out_index"][start:stop]
        else:
            rows = torch.arange(n_out, device=device).expand(d, n_out)
        group_of_row = torch.arange(k_total, device=device) // self.k_out  # (K_out,)
        if self.permute_in:
            local = self._noise["in_index"][start:stop].view(d, groups, self.k_in)
            local = local - torch.arange(groups, device=device).view(1, groups, 1) * in_g
            cols = local[:, group_of_row, :]  # (d, K_out, k_in)
        else:
            cols = torch.arange(in_g, device=device).expand(d, k_total, in_g)
        return rows.unsqueeze(2) * in_g + cols

    def _weight_grad(self, coef):
        n_out, n_in, groups, kernel = self.geometry
        shared, noise = self._noise["shared"], self._noise
        in_g, d = n_in // groups, coef.shape[0]
        if self.permute_in and not self.permute_out:
            # g = E @ M per group, M[j, pi_d[j]] += coef_d
            local = noise["in_index"].view(d, groups, self.k_in) - torch.arange(
                groups, device=coef.device).view(1, groups, 1) * in_g
            m = coef.new_zeros(groups, self.k_in, in_g)
            m.scatter_add_(2, local.permute(1, 2, 0), coef.view(1, 1, d).expand(groups, self.k_in, d))
            e = shared.reshape(groups, n_out // groups, self.k_in, -1)
            return torch.einsum("gojs,gjc->gocs", e, m).reshape(self.weight.shape)
        if self.permute_out and not self.permute_in:
            # g = N^T @ E, N[i, rho_d[i]] += coef_d
            k_total = groups * self.k_out
            m = coef.new_zeros(k_total, n_out)
            m.scatter_add_(1, noise["out_index"].t(), coef.view(1, d).expand(k_total, d))
            return (m.t() @ shared.reshape(k_total, -1)).reshape(self.weight.shape)
        # both sides permuted: scatter E once per direction, in blocks that bound the memory
        spatial = math.prod(kernel)
        grad = coef.new_zeros(n_out * in_g, spatial)
        flat_e = shared.reshape(-1, spatial)
        block = max(1, (1 << 24) // flat_e.numel())
        for lo in range(0, d, block):
            hi = min(d, lo + block)
            index = self._flat_index(lo, hi).reshape(-1)
            src = (coef[lo:hi].view(-1, 1, 1) * flat_e.unsqueeze(0)).reshape(-1, spatial)
            grad.index_add_(0, index, src)
        return grad.reshape(self.weight.shape)

    def _dense_weight_noise(self):
        n_out, n_in, groups, kernel = self.geometry
        d, spatial = self.local_directions, math.prod(kernel)
        flat_e = self._noise["shared"].reshape(1, -1, spatial)
        dense = flat_e.new_zeros(d, n_out * (n_in // groups), spatial)
        index = self._flat_index().reshape(d, -1, 1).expand(-1, -1, spatial)
        return dense.scatter_(1, index, flat_e.expand(d, -1, -1)).reshape(d, *self.weight.shape)

    def _weight_sq_norms(self):
        # every direction uses all of E, moved or sign-flipped: the same norm for all
        return self._noise["shared"].pow(2).sum().expand(self.local_directions)

    def _options_repr(self) -> str:
        return f", permutation={self.permutation!r}, k_in={self.k_in}, k_out={self.k_out}"


class PermutedLinear(_PermutedMixin, PerturbedLinearBase, nn.Linear):
    """nn.Linear whose directions share one Gaussian noise matrix under per-direction permutations.

    Args:
        in_features, out_features, bias, device, dtype: as for :class:`torch.nn.Linear`.
        directions: population size D.
        permutation: which side each direction permutes: "in", "out", "both" or "auto" (a sparse
            side, else the larger side).
        in_sparsity, out_sparsity: perturbed inputs / outputs per direction, a fraction (float) or a
            count (int); None perturbs all. Fewer inputs means a cheaper extra GEMM.

    Shape:
        population input (R * D, ..., in) -> (R * D, ..., out); row n uses direction n % D.
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None,
                 permutation="auto", in_sparsity=None, out_sparsity=None):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._init_permuted(directions, permutation, in_sparsity, out_sparsity)


class PermutedConv2d(_PermutedMixin, PerturbedConv2dBase, nn.Conv2d):
    """nn.Conv2d whose directions share one Gaussian kernel under per-direction channel permutations.

    Args:
        as for :class:`torch.nn.Conv2d`, plus ``directions``, ``permutation``, ``in_sparsity`` and
        ``out_sparsity`` as for :class:`PermutedLinear` (channels; counts are per group).

    Shape:
        population input (R * D, C_in, H, W) -> (R * D, C_out, H_out, W_out).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, *, directions=None,
                 permutation="auto", in_sparsity=None, out_sparsity=None):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                           bias, padding_mode, device, dtype)
        self._init_permuted(directions, permutation, in_sparsity, out_sparsity)
