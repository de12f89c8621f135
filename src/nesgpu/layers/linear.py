"""Perturbed nn.Linear: any kind; the classic names (LowRankLinear, ...) fix the kind."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Flipout, Geometry, LowRank, Permuted, Sparse, make_kind
from .base import PerturbedModule
from .layout import compute_dtype


class PerturbedLinear(PerturbedModule, nn.Linear):
    """nn.Linear whose population forward adds each direction's weight noise (IID Gaussian by default).

    Args:
        in_features, out_features, bias, device, dtype: as for :class:`torch.nn.Linear`.
        kind: a :class:`nesgpu.kinds.Kind` or its name ("gaussian", "sparse", "permuted", "flipout",
            "lowrank"); ``**options`` are the kind's options when given by name.
        directions: population size D (set by :class:`nesgpu.PerturbedModel` when None).

    Shape:
        population input (R * D, *, in) -> (R * D, *, out); row n uses direction n % D, and every
        position of a row (e.g. of a sequence) the same direction.

    Example:
        >>> layer = PerturbedLinear(8, 4, kind="lowrank", rank=2, directions=16)
    """

    ROW_WISE = True
    PLANNED = True  # a plain call is the product alone: a decode step reuses its plan (products.py)

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, kind="gaussian",
                 directions=None, **options):
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self.init_perturbation(make_kind(kind, **options), directions,
                                {"weight": Geometry(out_features, in_features)}, "linear")

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__}: expected input of shape (repeats * directions, ..., "
                             f"{self.in_features}); got {tuple(x.shape)}")
        pop = self.population_of(x.shape[0], compute_dtype(x), x.device)
        if type(self)._shared_base is PerturbedLinear._shared_base:  # the plain product: the kind may fuse it
            return self.perturbed_linear(x, pop, "weight", "bias")
        x, y = self._shared_base(x)
        return self.perturbed_linear(x, pop, "weight", "bias", y=y)

    def call_plan(self, x, layout):
        return self.linear_plan(x, layout)

    def _shared_base(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the input the noise products see, the shared unperturbed product with the bias). A low-bit layer
        multiplies by its quantised weight (and may quantise the input first)."""
        return x, F.linear(x, self.weight, self.bias)

    def population_forward_shared(self, x: torch.Tensor, signs: int) -> torch.Tensor:
        """The population output for an input x (B, in) that every member shares: what
        :meth:`population_forward` returns for x repeated as rows (signs, B, D), without those rows. The
        plain product is computed once per sample and each direction's perturbation once per (sample,
        direction) for both signs; the result is written in one pass."""
        if x.dim() != 2 or x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__}: expected a shared input of shape (samples, {self.in_features}); "
                             f"got {tuple(x.shape)}")
        bsz, d = x.shape[0], self.local_directions
        pop = self.population_of(signs * bsz * d, compute_dtype(x), x.device)
        x, base = self._shared_base(x)  # base: (B, out)
        x = x.to(base.dtype)
        per_direction = base.new_zeros(bsz, d, self.out_features)
        noise = self.noise_of("weight", base.dtype)
        if noise is not None:
            self.slot_of("weight").kind.apply_shared_(x, per_direction, noise)
        if self.bias is not None:
            bias_noise = self.noise_of("bias", base.dtype)
            if bias_noise is not None:
                per_direction += bias_noise["z"].unsqueeze(0)
        # row (s, b, d): base_b + scale_s P_{b,d}; the scale of repeat (s, b) depends on the sign only
        scale = pop.scale.view(signs, bsz, 1, 1)
        return torch.addcmul(base.view(1, bsz, 1, -1), scale, per_direction.unsqueeze(0)).view(-1, self.out_features)


class SparsePerturbedLinear(PerturbedLinear):
    """PerturbedLinear with kind :class:`nesgpu.kinds.Sparse`: direction d perturbs ``k`` input columns."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None, k=None):
        super().__init__(in_features, out_features, bias, device, dtype, kind=Sparse(k), directions=directions)


class PermutedLinear(PerturbedLinear):
    """PerturbedLinear with kind :class:`nesgpu.kinds.Permuted` (shared noise, per-direction permutations)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None,
                 permutation="auto", in_sparsity=None, out_sparsity=None):
        super().__init__(in_features, out_features, bias, device, dtype, directions=directions,
                         kind=Permuted(permutation, in_sparsity, out_sparsity))


class FlipoutLinear(PerturbedLinear):
    """PerturbedLinear with kind :class:`nesgpu.kinds.Flipout` (shared noise, per-direction sign flips)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None,
                 signs="both"):
        super().__init__(in_features, out_features, bias, device, dtype, kind=Flipout(signs), directions=directions)


class LowRankLinear(PerturbedLinear):
    """PerturbedLinear with kind :class:`nesgpu.kinds.LowRank`: z_d = A_d B_d^T / sqrt(r)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, directions=None, rank=1):
        super().__init__(in_features, out_features, bias, device, dtype, kind=LowRank(rank), directions=directions)
