"""CMA-ES (Hansen and Ostermeier 2001; Hansen 2016, "The CMA Evolution Strategy: A Tutorial"): a full covariance
over all n evolving parameters, for small models (n up to :data:`MAX_PARAMETERS`).

Members are m + sigma * y_d with y_d = A z_d, z_d the unit noise of all perturbed parameters as one vector and
A = C^(1/2) = B diag(sqrt(eigenvalues)) B^T the symmetric square root of the covariance C as last decomposed
(the perturbed model's covariance factor, :mod:`nesgpu.layers.covariance`; the identity at the start). With the
members ranked best first and weighted as in the tutorial's active CMA-ES (:func:`active_weights`: the mu =
members / 2 best get the recombination weights w_i > 0, summing to 1, mu_eff = 1 / sum w_i^2; the others
negative weights) and sums over i <= mu taken over the positive ones only:

    m     <- m + sigma * sum_{i<=mu} w_i y_i                                   (SGD at lr 1)
    p_s   <- (1 - c_s) p_s + sqrt(c_s (2 - c_s) mu_eff) sum_{i<=mu} w_i z_i     (= C^(-1/2) sum w_i y_i)
    p_c   <- (1 - c_c) p_c + h_s sqrt(c_c (2 - c_c) mu_eff) sum_{i<=mu} w_i y_i
    C     <- (1 - c_1 - c_mu sum_i w_i + (1 - h_s) c_1 c_c (2 - c_c)) C + c_1 p_c p_c^T + c_mu sum_i w'_i y_i y_i^T
    sigma <- sigma exp(c_s / d_s (|p_s| / E|N(0, I)| - 1))

(w'_i = w_i, or w_i n / |z_i|^2 for a negative one) with the tutorial's default rates for n. Members are
independent by default; with antithetic pairs only the better of each pair competes, as in
:mod:`nesgpu.strategies.sep_cma_es`. C is decomposed
again (``torch.linalg.eigh``, O(n^3)) every 1 / (10 n (c_1 + c_mu)) generations, the tutorial's lazy update, so a
generation costs D n^2 (the noise and the rank-mu sum) plus, now and then, n^3. The paths and C (float64) are
per-run tensors the trainer keeps and checkpoints, with A; |p_s| is one host read per step. Antithetic pairs are
two members each. Needs ``--layer gaussian``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from . import checkpoint
from .base import StrategyState
from .scaled import ScaleAdapting, mean_step_weights
from .schedules import Schedule
from .sep_cma_es import CMARates, recombination_weights

MAX_PARAMETERS = 10_000
"""The most evolving parameters cma_es takes: its covariance holds n^2 entries (800 MB in float64 at 10k) and
each decomposition costs n^3."""


class CMAES(ScaleAdapting):
    """Full-covariance CMA-ES over the perturbed model's covariance factor (see the module docstring).

    Args:
        directions: the population's directions (2 members each with antithetic pairs).
        num_perturbed: n, the evolving parameters (at most :data:`MAX_PARAMETERS`).
    """

    name = "cma_es"
    population_options: ClassVar[tuple[str, ...]] = ("num_perturbed",)
    adapts_scales = False
    adapts_covariance = True
    max_parameters = MAX_PARAMETERS
    pairwise = True
    default_antithetic = False

    def __init__(self, directions: int, antithetic: bool = True, num_perturbed: int | None = None,
                 sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        self.n = self.evolving(num_perturbed, MAX_PARAMETERS, "keeps an n x n covariance",
                               "sep_cma_es or snes (a sigma per parameter, n entries)")
        self.competes()
        self.mu_eff = float(1 / recombination_weights(self.candidates).square().sum())
        self.rates = CMARates.of(num_perturbed, self.mu_eff, separable=False)
        self.weights = active_weights(self.candidates, num_perturbed, self.rates)
        self.weight_sum = float(self.weights.sum())
        self.eigen_every = max(1, int(1 / (10 * num_perturbed * (self.rates.c_1 + self.rates.c_mu))))

    def table(self, device) -> torch.Tensor:
        """The active weights, best first (:func:`active_weights`)."""
        return self.weights.to(device)

    def tell(self, state: StrategyState, fitness: torch.Tensor, sq_norms: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, StrategyState]:
        """The mean moves by the members of positive weight only."""
        weights = self.scale_weights(state, fitness).clamp(min=0)
        return mean_step_weights(weights, self.directions, state.sigma), self.advance(state, state.sigma)

    def adapt_covariance(self, state: StrategyState, factor: torch.Tensor, first: torch.Tensor,
                         second: torch.Tensor, paths: dict) -> tuple[torch.Tensor | None, dict, StrategyState]:
        """The new factor A (None: unchanged until the next decomposition), the paths and C, and the state after
        the step, from ``first`` = sum w z (unit noise) and ``second`` = sum w y y^T (``state`` is the one
        :meth:`tell` advanced: its step counts this one)."""
        r, mu_eff = self.rates, self.mu_eff
        first, second = first.to(torch.float64), second.to(torch.float64)
        zeros = torch.zeros_like(first)
        p_s = (1 - r.c_s) * paths.get("p_s", zeros) + math.sqrt(r.c_s * (2 - r.c_s) * mu_eff) * first
        norm = float(p_s.norm())  # the step's second host read
        h_s = norm / math.sqrt(1 - (1 - r.c_s) ** (2 * state.step)) < (1.4 + 2 / (self.n + 1)) * r.chi_n
        y_w = factor.to(torch.float64) @ first  # sum w y = A sum w z
        p_c = (1 - r.c_c) * paths.get("p_c", zeros) + float(h_s) * math.sqrt(r.c_c * (2 - r.c_c) * mu_eff) * y_w
        keep = 1 - r.c_1 - r.c_mu * self.weight_sum + (0.0 if h_s else r.c_1 * r.c_c * (2 - r.c_c))
        cov = paths["C"] if "C" in paths else torch.eye(self.n, dtype=torch.float64, device=first.device)
        cov = keep * cov + r.c_1 * torch.outer(p_c, p_c) + r.c_mu * second
        sigma = state.sigma * math.exp(r.c_s / r.d_s * (norm / r.chi_n - 1))
        new_factor = square_root(cov).to(factor.dtype) if state.step % self.eigen_every == 0 else None
        return new_factor, {"C": cov, "p_s": p_s, "p_c": p_c}, dataclasses.replace(state, sigma=sigma)

    def check_state(self, state: StrategyState, values: dict) -> None:
        """The checkpoint's factor A ((n, n), finite), its paths (all or none: p_s and p_c (n,), C (n, n)), C
        positive definite and A consistent with it, the paths no longer than its updates can make them (the
        tolerances of :mod:`nesgpu.strategies.checkpoint`)."""
        n, r = self.n, self.rates
        factor = checkpoint.tensor(self.name, "covariance factor", values.get("covariance"), (n, n))
        paths = checkpoint.paths(self.name, values, {"C": (n, n), "p_s": (n,), "p_c": (n,)})
        cov = paths.get("C", torch.eye(n, dtype=torch.float64, device=factor.device)).to(factor.device)
        checkpoint.positive_definite(self.name, "path 'C' (the covariance)", cov)
        checkpoint.consistent(self.name, factor, cov)
        if paths:
            checkpoint.path_length(self.name, "path 'p_s'", paths["p_s"], r.c_s, self.mu_eff, r.chi_n)
            checkpoint.path_length(self.name, "path 'p_c'", paths["p_c"], r.c_c, self.mu_eff, r.chi_n,
                                   checkpoint.TYPICAL * math.sqrt(float(cov.trace())))


def active_weights(members: int, n: int, rates: CMARates) -> torch.Tensor:
    """The tutorial's weights of all members, best first: w'_i = ln((members + 1) / 2) - ln i, the positive
    ones (the mu = members // 2 best) normalised to sum 1, the negative ones to sum -min(1 + c_1 / c_mu,
    1 + 2 mu_eff^- / (mu_eff + 2), (1 - c_1 - c_mu) / (n c_mu)) (Hansen 2016, eq. 49-53)."""
    raw = math.log((members + 1) / 2) - torch.log(torch.arange(1, members + 1, dtype=torch.float64))
    positive, negative = raw.clamp(min=0), raw.clamp(max=0)
    mu_eff = float(positive.sum() ** 2 / positive.square().sum())
    if not bool((negative < 0).any()):
        return positive / positive.sum()
    mu_eff_minus = float(negative.sum() ** 2 / negative.square().sum())
    alpha = min(1 + rates.c_1 / rates.c_mu, 1 + 2 * mu_eff_minus / (mu_eff + 2),
                (1 - rates.c_1 - rates.c_mu) / (n * rates.c_mu))
    return positive / positive.sum() + alpha * negative / negative.abs().sum()


def square_root(cov: torch.Tensor) -> torch.Tensor:
    """The symmetric square root B diag(sqrt(lambda)) B^T of a covariance (its symmetric part; eigenvalues
    below the dtype's tiny, from rounding, taken as tiny)."""
    values, vectors = torch.linalg.eigh((cov + cov.t()) / 2)
    roots = values.clamp(min=torch.finfo(values.dtype).tiny).sqrt()
    return (vectors * roots) @ vectors.t()


__all__ = ["CMAES", "MAX_PARAMETERS", "active_weights", "square_root"]
