"""Augmented Random Search (Mania et al. 2018, "Simple random search provides a competitive approach to
reinforcement learning"): mirrored directions, the top b of them, steps scaled by the reward std.

V1 uses raw observations; V2 keeps running observation statistics (the task normalises inputs).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from ..model import PerturbedModel
from .base import Strategy, antithetic_halves
from .schedules import Schedule
from .shaping import top_directions


class ARS(Strategy):
    """theta <- theta + lr / (b sigma_R) sum_{top b} (r+_d - r-_d) z_d, sigma_R the std of those 2b returns.

    Args:
        pm: the perturbed model; must use antithetic sampling.
        optimizer: default ``torch.optim.SGD(lr=lr)``, which gives the paper's update exactly.
        lr: the step size alpha (default 0.02).
        top_b: how many directions to use (default: all).
        version: "v1" (raw observations) or "v2" (normalised observations).
    """

    name = "ars"
    default_lr = 0.02
    config_options: ClassVar[dict[str, str]] = {"top_b": "top_b", "ars_version": "version"}

    @classmethod
    def uses_observation_statistics(cls, version: str = "v2", **options) -> bool:
        return version == "v2"

    def __init__(self, pm: PerturbedModel, optimizer: torch.optim.Optimizer | None = None, lr: float | None = None,
                 top_b: int | None = None, version: str = "v2",
                 sigma_schedule: Schedule | None = None, lr_schedule: Schedule | None = None):
        if not pm.antithetic:
            raise ValueError("ARS needs antithetic sampling: PerturbedModel(..., antithetic=True)")
        if version not in ("v1", "v2"):
            raise ValueError(f"ARS version must be 'v1' or 'v2'; got {version!r}")
        top_b = pm.directions if top_b is None else top_b
        if not 1 <= top_b <= pm.directions:
            raise ValueError(f"top_b must be in [1, {pm.directions}]; got {top_b}")
        optimizer = optimizer or torch.optim.SGD(pm.model.parameters(), lr=self.default_lr if lr is None else lr)
        super().__init__(pm, optimizer, sigma_schedule, lr_schedule)
        self.top_b = top_b
        self.version = version

    def weights(self, fitness):
        plus, minus = antithetic_halves(fitness)
        mask = top_directions(plus, minus, self.top_b)
        reward_std = torch.cat([plus[mask], minus[mask]]).std(unbiased=False)
        reward_std = torch.where(reward_std > 0, reward_std, torch.ones_like(reward_std))
        # pm.update scales by 1/(D sigma); the paper's step has 1/(b sigma_R) and unit-scale z
        scale = self.pm.directions * self.pm.sigma / (self.top_b * reward_std)
        return -(plus - minus) * mask * scale
