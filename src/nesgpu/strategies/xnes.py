"""xNES, exponential natural evolution strategies (Glasmachers, Schaul, Sun, Wierstra and Schmidhuber 2010): a full
covariance moved along its natural gradient in the exponential parameterisation, for small models (n up to
:data:`MAX_PARAMETERS`).

Members are m + sigma * B z_d (B the perturbed model's covariance factor, :mod:`nesgpu.layers.covariance`; the
identity at the start). From NES's rank utilities u (best first, summing to zero, as SNES's):

    m     <- m + sigma * B sum_i u_i z_i                     (SGD at lr 1)
    G     =  sum_i u_i (z_i z_i^T - I),  G_s = tr(G) / n
    sigma <- sigma * exp(eta / 2 * G_s)
    B     <- B expm(eta / 2 * (G - G_s I))

with eta = 3 (3 + ln n) / (5 n sqrt n) for sigma and B (the paper's defaults). A generation costs D n^2 (the
noise, the statistic) and one n x n matrix exponential (n^3), hence the lower limit than ``cma_es``'s. Antithetic
pairs are two members each. Needs ``--layer gaussian``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from . import checkpoint
from .base import StrategyState
from .scaled import ScaleAdapting, snes_utilities
from .schedules import Schedule

MAX_PARAMETERS = 2_000
"""The most evolving parameters xnes takes: every generation takes an n x n matrix exponential."""


class XNES(ScaleAdapting):
    """Exponential NES over the perturbed model's covariance factor (see the module docstring).

    Args:
        directions: the population's directions (2 members each with antithetic pairs).
        num_perturbed: n, the evolving parameters (at most :data:`MAX_PARAMETERS`).
    """

    name = "xnes"
    population_options: ClassVar[tuple[str, ...]] = ("num_perturbed",)
    adapts_scales = False
    adapts_covariance = True
    max_parameters = MAX_PARAMETERS
    natural_statistics = True

    def __init__(self, directions: int, antithetic: bool = True, num_perturbed: int | None = None,
                 sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        self.competes("ranks its members against each other (its utilities sum to zero)")
        self.n = self.evolving(num_perturbed, MAX_PARAMETERS, "takes an n x n matrix exponential every generation",
                               "cma_es (up to 10,000), or sep_cma_es or snes (a sigma per parameter)")
        self.rate = 3 * (3 + math.log(num_perturbed)) / (5 * num_perturbed * math.sqrt(num_perturbed))

    def table(self, device) -> torch.Tensor:
        """NES's utilities (they sum to zero)."""
        return snes_utilities(self.members, device=device)

    def adapt_covariance(self, state: StrategyState, factor: torch.Tensor, first: torch.Tensor,
                         second: torch.Tensor, paths: dict) -> tuple[torch.Tensor, dict, StrategyState]:
        """The new factor B and sigma from ``second`` = sum u z z^T (unit noise; the utilities sum to zero, so
        it is sum u (z z^T - I)); ``first`` is not needed (the mean moved through the update)."""
        gradient = second.to(torch.float64)
        trace = float(torch.diagonal(gradient).sum()) / self.n  # the step's host read
        shape = gradient - trace * torch.eye(self.n, dtype=gradient.dtype, device=gradient.device)
        new_factor = factor.to(torch.float64) @ torch.linalg.matrix_exp(self.rate / 2 * shape)
        sigma = state.sigma * math.exp(self.rate / 2 * trace)
        return new_factor.to(factor.dtype), paths, dataclasses.replace(state, sigma=sigma)

    def check_state(self, state: StrategyState, values: dict) -> None:
        """The checkpoint's factor B: (n, n), finite, det B = 1 and conditioned as a covariance may be (within
        the tolerances of :mod:`nesgpu.strategies.checkpoint`); no evolution paths."""
        checkpoint.no_paths(self.name, values)
        factor = checkpoint.tensor(self.name, "covariance factor", values.get("covariance"), (self.n, self.n))
        checkpoint.unit_determinant(self.name, factor)
        checkpoint.well_conditioned(self.name, factor)


__all__ = ["MAX_PARAMETERS", "XNES"]
