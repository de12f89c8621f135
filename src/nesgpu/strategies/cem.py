"""The cross-entropy method with a diagonal Gaussian (Rubinstein 1999; as EvoTorch's and evosax's CEM): the
next mean is the elites' mean, the next sigma of each parameter their spread.

Members are theta + sigma * s_r * (S o z_d) (the perturbed model's scales ``S`` start at 1). With the ``e``
best members (``elite_ratio`` of them) weighted 1 / e:

    theta <- theta + sigma * S o sum_elites z / e               (SGD at lr 1: the elites' mean)
    S^2   <- S^2 o ((1 - smoothing) + smoothing * sum_elites z o z / e)

the elites' variance about the old mean, blended with the old by ``smoothing`` (0.1 by default: replacing it
outright, 1, collapses sigma early; on a sphere of 100 and an ellipsoid of 30 dimensions 0.1 ends 60 and 900
times closer, BENCHMARKS.md). Antithetic pairs are two members each. Needs a kind that takes a sigma per
element (``--layer gaussian``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..options import check_options, option
from .base import Strategy, StrategyState
from .scaled import elite_utilities, mean_step_weights, member_fitness, ranked_utilities
from .schedules import Schedule


@dataclass(frozen=True)
class CEMOptions:
    elite_ratio: float = option(0.5, "share of the members that are elites", above=0, at_most=1)
    smoothing: float = option(0.1, "weight of the elites' variance in the new one (1: theirs alone, as EvoTorch's "
                                   "CEM; 0.1 as evosax's SimpleES)", above=0, at_most=1)

    def __post_init__(self):
        check_options(self, "cem")


class CEM(Strategy):
    """The cross-entropy method over the perturbed model's per-parameter scales (see the module docstring).

    Args:
        directions: the population's directions (2 members each with antithetic pairs).
        elite_ratio: the share of members whose mean and spread make the next distribution.
        smoothing: the weight of the elites' variance against the old one.
    """

    name = "cem"
    default_lr = 1.0  # the mean moves to the elites' mean
    Options: ClassVar[type] = CEMOptions
    adapts_sigma = True
    adapts_scales = True
    linear_policy = True

    def __init__(self, directions: int, antithetic: bool = True, elite_ratio: float = 0.5, smoothing: float = 0.1,
                 sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        self.options = CEMOptions(elite_ratio, smoothing)
        if sigma_schedule is not None:
            raise ValueError("cem adapts a sigma per parameter itself: no sigma schedule applies (drop "
                             "--sigma-schedule)")
        self.members = directions * (2 if antithetic else 1)
        self.elites = max(1, round(elite_ratio * self.members))
        self.smoothing = smoothing
        self._told: tuple | None = None  # (fitness, its weights) of the latest step

    def make_optimizer(self, parameters, lr: float | None = None) -> torch.optim.Optimizer:
        return torch.optim.SGD(parameters, lr=self.default_lr if lr is None else lr)

    @classmethod
    def lr_for_sigma(cls, sigma: float) -> float:
        return cls.default_lr

    def scale_weights(self, state: StrategyState, fitness: torch.Tensor) -> torch.Tensor:
        """1 / e for each elite member, 0 for the others (S, D); ties share."""
        if self._told is not None and self._told[0] is fitness:  # the step's update asks again: computed once
            return self._told[1]
        members = member_fitness(self.check(fitness, state), self.antithetic)
        weights = ranked_utilities(members, elite_utilities(self.members, self.elites, device=members.device))
        self._told = (fitness, weights)
        return weights

    def tell(self, state: StrategyState, fitness: torch.Tensor, sq_norms: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, StrategyState]:
        weights = self.scale_weights(state, fitness)
        return mean_step_weights(weights, self.directions, state.sigma), self.advance(state, state.sigma)

    def rescale(self, scale: torch.Tensor, statistic: torch.Tensor) -> torch.Tensor:
        """S o sqrt((1 - smoothing) + smoothing * sum_elites z o z / e): the statistic is sum w (z o z - 1) with
        weights that sum to 1."""
        ratio = (1 - self.smoothing) + self.smoothing * (statistic.to(scale.dtype) + 1)
        return scale * ratio.clamp(min=torch.finfo(scale.dtype).tiny).sqrt()


__all__ = ["CEM", "CEMOptions"]
