"""Augmented Random Search (Mania et al. 2018, "Simple random search provides a competitive approach to
reinforcement learning"): mirrored directions, the top b of them, steps scaled by the reward std.

V1 uses raw observations; V2 keeps running observation statistics (the task normalises inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..options import check_options, option
from .base import SUBSPACE_HELP, Strategy, antithetic_halves
from .schedules import Schedule
from .shaping import top_directions


@dataclass(frozen=True)
class ARSOptions:
    top_b: int | None = option(None, "directions used per step (default: all)", at_least=1, defines=True)
    ars_version: str = option("v2", "v1 (raw observations) or v2 (running observation statistics)",
                              choices=("v1", "v2"), arg="version", defines=True)
    subspace: float = option(1.0, SUBSPACE_HELP, above=0, at_most=1)

    def __post_init__(self):
        check_options(self, "ars")


class ARS(Strategy):
    """theta <- theta + lr / (b sigma_R) sum_{top b} (r+_d - r-_d) z_d, sigma_R the std of those 2b returns.

    Args:
        directions: the population's directions; sampling must be antithetic.
        top_b: how many directions to use (default: all).
        version: "v1" (raw observations) or "v2" (normalised observations).
        subspace: the share of the perturbed parameters each step perturbs and updates (a random subset of the
            modules per step; 1: all): see :mod:`nesgpu.layers.subspace`.

    Its default optimizer, ``torch.optim.SGD``, gives the paper's update exactly.
    """

    name = "ars"
    default_lr = 0.02
    needs_antithetic = True
    Options: ClassVar[type] = ARSOptions
    @classmethod
    def check_options(cls, options: ARSOptions, directions: int) -> None:
        if options.top_b is not None and options.top_b > directions:
            raise ValueError(f"top_b must be in [1, {directions}] (the directions); got {options.top_b}")

    def __init__(self, directions: int, antithetic: bool = True, top_b: int | None = None, version: str = "v2",
                 sigma_schedule: Schedule | None = None, subspace: float = 1.0):
        super().__init__(directions, antithetic, sigma_schedule)
        self.options = ARSOptions(top_b, version, subspace)
        self.check_options(self.options, directions)
        self.top_b = directions if top_b is None else top_b
        self.version = version

    def make_optimizer(self, parameters, lr: float | None = None) -> torch.optim.Optimizer:
        return torch.optim.SGD(parameters, lr=self.default_lr if lr is None else lr)

    @classmethod
    def lr_for_sigma(cls, sigma: float) -> float:
        """sigma / 2, "Evolution Strategies at Scale"'s alpha for its plain SGD step on reward-normalised
        differences, the shape of this update."""
        return sigma / 2

    def weights(self, fitness: torch.Tensor, sigma: float) -> torch.Tensor:
        plus, minus = antithetic_halves(fitness)
        mask = top_directions(plus, minus, self.top_b)
        reward_std = torch.cat([plus[mask], minus[mask]]).std(unbiased=False)
        reward_std = torch.where(reward_std > 0, reward_std, torch.ones_like(reward_std))
        # the update scales by 1/(D sigma); the paper's step has 1/(b sigma_R) and unit-scale z
        scale = self.directions * sigma / (self.top_b * reward_std)
        return -(plus - minus) * mask * scale
