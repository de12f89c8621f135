"""Separable CMA-ES (Ros and Hansen 2008): CMA-ES with a diagonal covariance, whose learning rates grow by
(n + 2) / 3 over full CMA-ES's; cumulative step-size adaptation of the global sigma.

Members are m + sigma * (S o z_d) with S = sqrt(c), c the diagonal of the covariance (the perturbed model's
scales; S = 1 at the start). With the mu = members / 2 best weighted w_i = ln(mu + 1/2) - ln i (normalised),
mu_eff = 1 / sum w_i^2, and y = S o z:

    m     <- m + sigma * sum w_i y_i                                  (SGD at lr 1)
    p_s   <- (1 - c_s) p_s + sqrt(c_s (2 - c_s) mu_eff) sum w_i z_i
    p_c   <- (1 - c_c) p_c + h_s sqrt(c_c (2 - c_c) mu_eff) sum w_i y_i
    c     <- (1 - c_1 - c_mu + (1 - h_s) c_1 c_c (2 - c_c)) c + c_1 p_c^2 + c_mu sum w_i y_i^2
    sigma <- sigma exp(c_s / d_s (|p_s| / E|N(0, I)| - 1))

with Hansen's default rates for n evolving parameters (``cma_rates``). The paths are per-parameter tensors the
trainer keeps (and checkpoints) beside the scales; |p_s| is one host read per step. Members are independent by
default (``default_antithetic``); with antithetic pairs only the better of each pair competes
(:func:`~nesgpu.strategies.scaled.pairwise_utilities`), since a pair selected whole cancels in sum w_i z_i and
cumulative step-size adaptation then shrinks sigma on a noisy fitness (1e5-fold in 300 steps of pure noise).
Needs ``--layer gaussian``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch

from . import checkpoint
from .base import StrategyState
from .scaled import ScaleAdapting
from .schedules import Schedule


def recombination_weights(members: int) -> torch.Tensor:
    """CMA-ES's positive weights of the mu = members // 2 best, best first (sum 1), zero for the others."""
    mu = members // 2
    raw = math.log(mu + 0.5) - torch.log(torch.arange(1, mu + 1, dtype=torch.float64))
    return torch.cat([raw / raw.sum(), torch.zeros(members - mu, dtype=torch.float64)])


@dataclasses.dataclass(frozen=True)
class CMARates:
    """CMA-ES's learning rates for n parameters and mu_eff (Hansen 2016, "The CMA Evolution Strategy: A
    Tutorial"); ``separable``: the diagonal variant's covariance rates (times (n + 2) / 3)."""

    c_s: float
    d_s: float
    c_c: float
    c_1: float
    c_mu: float
    chi_n: float  # E|N(0, I)|

    @classmethod
    def of(cls, n: int, mu_eff: float, separable: bool = True) -> CMARates:
        c_s = (mu_eff + 2) / (n + mu_eff + 5)
        d_s = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_s
        c_c = (4 + mu_eff / n) / (n + 4 + 2 * mu_eff / n)
        faster = (n + 2) / 3 if separable else 1.0
        c_1 = min(1.0, 2 / ((n + 1.3) ** 2 + mu_eff) * faster)
        quarter = 0.0 if separable else 0.25  # the tutorial's 2016 rate; Ros and Hansen's for the separable one
        c_mu = min(1 - c_1, 2 * (mu_eff - 2 + quarter + 1 / mu_eff) / ((n + 2) ** 2 + mu_eff) * faster)
        chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n))
        return cls(c_s, d_s, c_c, c_1, c_mu, chi_n)


class SepCMAES(ScaleAdapting):
    """Separable CMA-ES over the perturbed model's per-parameter scales (see the module docstring).

    Args:
        directions: the population's directions (2 members each with antithetic pairs).
        num_perturbed: n, the evolving parameters (the learning rates depend on it).
    """

    name = "sep_cma_es"
    population_options: ClassVar[tuple[str, ...]] = ("num_perturbed",)
    needs_means = True
    pairwise = True
    default_antithetic = False

    def __init__(self, directions: int, antithetic: bool = True, num_perturbed: int | None = None,
                 sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        self.n = self.evolving(num_perturbed)
        self.competes()
        self.weights = recombination_weights(self.candidates)
        self.mu_eff = float(1 / self.weights.square().sum())
        self.rates = CMARates.of(num_perturbed, self.mu_eff)

    def table(self, device) -> torch.Tensor:
        """The recombination weights of the mu best (sum 1), 0 for the others."""
        return self.weights.to(device)

    def adapt(self, state: StrategyState, scales: dict, seconds: dict, means: dict, paths: dict
              ) -> tuple[dict, dict, StrategyState]:
        """The paths, the diagonal covariance (as S = sqrt(c)) and sigma after the step (``state`` is the one
        :meth:`tell` advanced: its step counts this one)."""
        r, mu_eff = self.rates, self.mu_eff
        kick = math.sqrt(r.c_s * (2 - r.c_s) * mu_eff)
        p_s = {k: (1 - r.c_s) * paths.get(f"p_s:{k}", torch.zeros_like(v)) + kick * v for k, v in means.items()}
        norm = math.sqrt(float(sum(v.square().sum() for v in p_s.values())))  # the step's second host read
        h_s = norm / math.sqrt(1 - (1 - r.c_s) ** (2 * state.step)) < (1.4 + 2 / (self.n + 1)) * r.chi_n
        new_scales, new_paths = {}, {}
        for k, mean in means.items():
            scale = scales[k]
            p_c = (1 - r.c_c) * paths.get(f"p_c:{k}", torch.zeros_like(mean)) + \
                float(h_s) * math.sqrt(r.c_c * (2 - r.c_c) * mu_eff) * (scale * mean)
            c = scale.square()
            keep = 1 - r.c_1 - r.c_mu + (0.0 if h_s else r.c_1 * r.c_c * (2 - r.c_c))
            c = keep * c + r.c_1 * p_c.square() + r.c_mu * c * (seconds[k] + 1)  # sum w y^2 = c o sum w z^2
            new_scales[k], new_paths[f"p_s:{k}"], new_paths[f"p_c:{k}"] = c.sqrt(), p_s[k], p_c
        sigma = state.sigma * math.exp(r.c_s / r.d_s * (norm / r.chi_n - 1))
        return new_scales, new_paths, dataclasses.replace(state, sigma=sigma)

    def check_state(self, state: StrategyState, values: dict) -> None:
        """The checkpoint's paths (all or none): p_s and p_c of each parameter of its scales, of the scale's shape
        and finite, no longer than their updates can make them (:mod:`nesgpu.strategies.checkpoint`). The scales
        themselves are the model's to check (``set_scales``)."""
        scales = values.get("scales")
        if not isinstance(scales, dict) or not all(isinstance(v, torch.Tensor) for v in scales.values()):
            checkpoint.no_paths(self.name, values)  # the trainer names the missing or broken scales
            return
        shapes = {f"{kind}:{name}": tuple(scale.shape) for name, scale in scales.items() for kind in ("p_s", "p_c")}
        paths = checkpoint.paths(self.name, values, shapes)
        if paths:
            r, names = self.rates, list(scales)
            p_s = torch.cat([paths[f"p_s:{name}"].flatten() for name in names])
            p_c = torch.cat([paths[f"p_c:{name}"].flatten() for name in names])
            trace = float(sum(scale.detach().to(torch.float64).square().sum() for scale in scales.values()))
            checkpoint.path_length(self.name, "paths 'p_s:*'", p_s, r.c_s, self.mu_eff, r.chi_n)
            checkpoint.path_length(self.name, "paths 'p_c:*'", p_c, r.c_c, self.mu_eff, r.chi_n,
                                   checkpoint.TYPICAL * math.sqrt(trace))


__all__ = ["CMARates", "SepCMAES", "recombination_weights"]
