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
from .scaled import ScaleAdapting, elite_utilities
from .schedules import Schedule


@dataclass(frozen=True)
class CEMOptions:
    elite_ratio: float = option(0.5, "share of the members that are elites", above=0, at_most=1)
    smoothing: float = option(0.1, "weight of the elites' variance in the new one (1: theirs alone, as EvoTorch's "
                                   "CEM; 0.1 as evosax's SimpleES)", above=0, at_most=1)

    def __post_init__(self):
        check_options(self, "cem")


class CEM(ScaleAdapting):
    """The cross-entropy method over the perturbed model's per-parameter scales (see the module docstring).

    Args:
        directions: the population's directions (2 members each with antithetic pairs).
        elite_ratio: the share of members whose mean and spread make the next distribution.
        smoothing: the weight of the elites' variance against the old one.
    """

    name = "cem"
    Options: ClassVar[type] = CEMOptions

    def __init__(self, directions: int, antithetic: bool = True, elite_ratio: float = 0.5, smoothing: float = 0.1,
                 sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        self.options = CEMOptions(elite_ratio, smoothing)
        self.elites = max(1, round(elite_ratio * self.members))
        self.smoothing = smoothing

    def table(self, device) -> torch.Tensor:
        """1 / e for each of the e elites, 0 for the others."""
        return elite_utilities(self.members, self.elites, device=device)

    def rescale(self, scale: torch.Tensor, statistic: torch.Tensor) -> torch.Tensor:
        """S o sqrt((1 - smoothing) + smoothing * sum_elites z o z / e): the statistic is sum w (z o z - 1) with
        weights that sum to 1."""
        ratio = (1 - self.smoothing) + self.smoothing * (statistic.to(scale.dtype) + 1)
        return scale * ratio.clamp(min=torch.finfo(scale.dtype).tiny).sqrt()


__all__ = ["CEM", "CEMOptions"]
