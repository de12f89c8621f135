"""Perturbed nn.Embedding: the lookup adds each direction's noise of the looked-up rows only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Geometry, make_kind
from .base import PerturbedModule


class PerturbedEmbedding(PerturbedModule, nn.Embedding):
    """nn.Embedding whose population lookup of row i adds z_d[i] (kinds "gaussian" and "lowrank").

    The table is a matrix of ``num_embeddings`` rows by ``embedding_dim`` columns. IID Gaussian noise
    keeps a (D, num, dim) table; low-rank noise z_d = A_d B_d^T / sqrt(r) gathers A_d's looked-up rows
    and multiplies by B_d, so it never builds a per-direction table. The ``padding_idx`` row is never
    perturbed (its noise is zero, also for an output head tied to the table), as autograd never updates it.
    Indices with one row (position ids that broadcast over the batch, as GPT-2's) give every population row
    its own perturbed lookup.

    Args:
        as for :class:`torch.nn.Embedding` (``max_norm`` is not supported: it rewrites the table during
        the forward), plus ``kind``, its ``**options`` and ``directions``.

    Shape:
        population input: indices (R * D, *) -> (R * D, *, embedding_dim); row n uses direction n % D.
    """

    ROW_WISE = True

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None, *,
                 kind="gaussian", directions=None, **options):
        if max_norm is not None:
            raise ValueError(f"max_norm={max_norm}: a perturbed embedding cannot renormalise its table during "
                             f"the forward; expected max_norm=None")
        nn.Embedding.__init__(self, num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                              scale_grad_by_freq, sparse, _weight, _freeze, device, dtype)
        self.init_perturbation(make_kind(kind, **options), directions,
                                {"weight": Geometry(num_embeddings, embedding_dim)}, "embedding")

    def population_forward(self, index: torch.Tensor) -> torch.Tensor:
        if index.dim() < 1 or index.is_floating_point():
            raise ValueError(f"{type(self).__name__}: expected integer indices of shape (repeats * directions, ...); "
                             f"got {index.dtype} of shape {tuple(index.shape)}")
        noise = self.noise_of("weight", self.weight.dtype)
        y = self._looked_up(index)
        if noise is None:
            return y
        pop = self.population_of(index.shape[0], y.dtype, y.device)
        rows = index.reshape(pop.repeats, pop.directions, -1)
        y4 = y.view(pop.repeats, pop.directions, rows.shape[-1], self.embedding_dim)
        self.slot_of("weight").kind.embed_(rows, y4, pop.scale, noise)  # the padding row's noise is zero
        return y

    def _looked_up(self, index: torch.Tensor) -> torch.Tensor:
        """The table's rows for ``index``; an index outside the table is named (torch's IndexError says only
        "index out of range in self"), at no cost to a good batch."""
        try:
            return F.embedding(index, self.weight, self.padding_idx)
        except IndexError as e:
            raise ValueError(f"{type(self).__name__}: token ids must be in [0, {self.num_embeddings}) (the "
                             f"vocabulary); got ids in [{int(index.min())}, {int(index.max())}]") from e

    def set_noise(self, seed: int, step: int, start: int = 0, stop: int | None = None) -> None:
        super().set_noise(seed, step, start, stop)
        noise = self.noise_record("weight")
        # z_d[padding_idx] = 0 as drawn: every use of the table, the update and dense z_d leave that row alone
        if self.padding_idx is not None and noise is not None:
            self.slot_of("weight").kind.zero_rows_(noise, self.padding_idx)

    def perturbed_numel(self) -> int:
        return super().perturbed_numel() - (self.embedding_dim if self.padding_idx is not None and
                                            self.weight.requires_grad else 0)
