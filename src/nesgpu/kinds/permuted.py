"""Permuted noise: one shared Gaussian tensor E, which each direction uses under its own permutation.

Direction d's noise places E's rows at output positions rho_d and E's columns at input positions pi_d:
``z_d[rho_d[i], pi_d[j]] = E[i, j]``. With sparsity, rho_d / pi_d pick only k of the rows / columns, and E
is scaled by sqrt(n / k) on that side so every entry of z_d keeps unit variance. For convolutions,
permutations stay inside each channel group and move whole input channels (the kernel's spatial layout
is kept).

Within one step every z_d is a rearrangement of the same E, so the mean of z_d over directions is not
zero (it is E averaged along the permuted axis). A population baseline (centred ranks, subtracting the
mean fitness) then removes the gradient's component along that mean, a bias no number of steps
removes. Antithetic sampling (+z_d and -z_d) cancels it exactly, so this kind requires it
(:class:`nesgpu.PerturbedModel` refuses the combination).

The forward is one extra GEMM with E: gather the inputs (in-permutation), multiply, scatter-add the
outputs (out-permutation). Noise memory: E (k_out x k_in x kernel) plus D * (k_in + k_out) indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..noise import random_subsets
from .base import Kind, randn
from .counts import resolve_count

PERMUTATIONS = ("in", "out", "both", "auto")


class Plan(NamedTuple):
    """How a geometry is permuted: counts per group and which sides move."""

    k_out: int
    k_in: int
    permute_in: bool
    permute_out: bool


@dataclass(frozen=True)
class Permuted(Kind):
    """Permuted noise: one shared noise matrix per step, with its rows or columns permuted per direction.

    Args:
        permutation: which side each direction permutes: "in", "out", "both" or "auto" (a sparse side,
            else the larger side).
        in_sparsity, out_sparsity: perturbed inputs / outputs per direction (per group), a fraction
            (float) or a count (int); None perturbs all. Fewer inputs means a cheaper extra GEMM.
    """

    name = "permuted"
    needs_antithetic = True
    permutation: str = field(default="auto", metadata={
        "help": "the side each direction permutes (auto: a sparse side, else the larger)", "choices": PERMUTATIONS})
    in_sparsity: int | float | None = field(default=None, metadata={
        "help": "perturbed inputs per direction: a count or a fraction (default: all)"})
    out_sparsity: int | float | None = field(default=None, metadata={
        "help": "perturbed outputs per direction: a count or a fraction (default: all)"})

    def __post_init__(self):
        if self.permutation not in PERMUTATIONS:
            raise ValueError(f"permutation must be one of {PERMUTATIONS}; got {self.permutation!r}")
        for name in ("in_sparsity", "out_sparsity"):
            if getattr(self, name) is not None:
                resolve_count(getattr(self, name), 1 << 62, name)

    def plan(self, g) -> Plan:
        out_g, in_g = g.out // g.groups, g.in_ // g.groups
        k_out = resolve_count(self.out_sparsity, out_g, "out_sparsity")
        k_in = resolve_count(self.in_sparsity, in_g, "in_sparsity")
        sparse_out, sparse_in = k_out < out_g, k_in < in_g
        permutation = self.permutation
        if permutation == "auto":  # sparse sides must be index-selected; else permute the larger side
            if sparse_in or sparse_out:
                permutation = "both" if sparse_in and sparse_out else ("in" if sparse_in else "out")
            else:
                permutation = "in" if in_g >= out_g else "out"
        return Plan(k_out, k_in, permutation in ("in", "both") or sparse_in,
                    permutation in ("out", "both") or sparse_out)

    def check(self, geometry):
        self.plan(geometry)

    def draw_shared(self, gen, geometry, like):
        g, p = geometry, self.plan(geometry)
        gain = math.sqrt((g.out // g.groups) / p.k_out * (g.in_ // g.groups) / p.k_in)
        return {"shared": randn(like, g.groups * p.k_out, p.k_in, *g.kernel, gen=gen).mul_(gain)}

    def draw_directions(self, gen, n, geometry, like):
        g, p, out = geometry, self.plan(geometry), {}
        if p.permute_in:
            out["in_index"] = random_subsets(g.in_, g.groups, p.k_in, n, gen, like.device)
        if p.permute_out:
            out["out_index"] = random_subsets(g.out, g.groups, p.k_out, n, gen, like.device)
        return out

    def apply_(self, op, x, y, scale, noise):
        p = self.plan(noise.geometry)
        rows = op.per_repeat(scale, x)
        if p.permute_in:
            x = op.gather_channels(x, noise["in_index"]).mul_(rows)
        shared = noise["shared"]
        if p.permute_in and not p.permute_out and op.channel_dim == y.dim() - 1 and x.dtype == y.dtype == shared.dtype:
            # channels last (Linear), in-permutation only: accumulate the GEMM straight into y
            y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), shared.t())
            return
        h = op.shared(x, shared, noise.geometry.groups)
        if not p.permute_in:
            h.mul_(rows)
        if p.permute_out:
            op.scatter_add_channels_(y, noise["out_index"], h)
        else:
            y.add_(h)

    def _flat_index(self, noise, start: int, stop: int) -> torch.Tensor:
        """For directions [start, stop): where entry (i, j) of E lands in z_d viewed as (out * in_g, ...).

        Returns int64 (d, K_out, k_in)."""
        g, p = noise.geometry, self.plan(noise.geometry)
        in_g, device = g.in_ // g.groups, noise["shared"].device
        k_total, d = g.groups * p.k_out, stop - start
        if p.permute_out:
            rows = noise["out_index"][start:stop]
        else:
            rows = torch.arange(g.out, device=device).expand(d, g.out)
        group_of_row = torch.arange(k_total, device=device) // p.k_out  # (K_out,)
        if p.permute_in:
            local = noise["in_index"][start:stop].view(d, g.groups, p.k_in)
            local = local - torch.arange(g.groups, device=device).view(1, g.groups, 1) * in_g
            cols = local[:, group_of_row, :]  # (d, K_out, k_in)
        else:
            cols = torch.arange(in_g, device=device).expand(d, k_total, in_g)
        return rows.unsqueeze(2) * in_g + cols

    def grad(self, noise, coef):
        g, p = noise.geometry, self.plan(noise.geometry)
        shared = noise["shared"]
        in_g, d, groups = g.in_ // g.groups, coef.shape[0], g.groups
        if p.permute_in and not p.permute_out:
            # g = E @ M per group, M[j, pi_d[j]] += coef_d
            local = noise["in_index"].view(d, groups, p.k_in) - torch.arange(
                groups, device=coef.device).view(1, groups, 1) * in_g
            m = coef.new_zeros(groups, p.k_in, in_g)
            m.scatter_add_(2, local.permute(1, 2, 0), coef.view(1, 1, d).expand(groups, p.k_in, d))
            e = shared.reshape(groups, g.out // groups, p.k_in, -1)
            return torch.einsum("gojs,gjc->gocs", e, m).reshape(g.shape)
        if p.permute_out and not p.permute_in:
            # g = N^T @ E, N[i, rho_d[i]] += coef_d
            k_total = groups * p.k_out
            m = coef.new_zeros(k_total, g.out)
            m.scatter_add_(1, noise["out_index"].t(), coef.view(1, d).expand(k_total, d))
            return (m.t() @ shared.reshape(k_total, -1)).reshape(g.shape)
        # both sides permuted: scatter E once per direction, in blocks that bound the memory
        spatial = math.prod(g.kernel)
        grad = coef.new_zeros(g.out * in_g, spatial)
        flat_e = shared.reshape(-1, spatial)
        block = max(1, (1 << 24) // flat_e.numel())
        for lo in range(0, d, block):
            hi = min(d, lo + block)
            index = self._flat_index(noise, lo, hi).reshape(-1)
            src = (coef[lo:hi].view(-1, 1, 1) * flat_e.unsqueeze(0)).reshape(-1, spatial)
            grad.index_add_(0, index, src)
        return grad.reshape(g.shape)

    def dense(self, noise):
        g, d = noise.geometry, noise.directions
        spatial = math.prod(g.kernel)
        flat_e = noise["shared"].reshape(1, -1, spatial)
        dense = flat_e.new_zeros(d, g.out * (g.in_ // g.groups), spatial)
        index = self._flat_index(noise, 0, d).reshape(d, -1, 1).expand(-1, -1, spatial)
        return dense.scatter_(1, index, flat_e.expand(d, -1, -1)).reshape(d, *g.shape)

    def sq_norms(self, noise):
        # every direction uses all of E, moved: the same norm for all
        return noise["shared"].pow(2).sum().expand(noise.directions)
