"""OpenAI-ES (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to Reinforcement
Learning"): centered-rank fitness shaping, mirrored sampling, L2 weight decay, and Adam."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..options import check_options, option
from .base import SUBSPACE_HELP, Strategy
from .schedules import Schedule
from .shaping import SHAPINGS, centered_per_repeat, get_shaping


@dataclass(frozen=True)
class OpenAIESOptions:
    shaping: str = option("centered_ranks", "fitness shaping", choices=tuple(SHAPINGS), defines=True)
    weight_decay: float = option(0.0, "L2 coefficient added to the gradient (the paper: 0.005)", at_least=0)
    subspace: float = option(1.0, SUBSPACE_HELP, above=0, at_most=1)

    def __post_init__(self):
        check_options(self, "openai_es")


class OpenAIES(Strategy):
    """g = -1/(D sigma) sum_{r,d} s_r u_{r,d} z_d / R, with u the shaped fitness; then the optimizer steps.
    Without antithetic pairs each repeat's u is centred over the directions (a fitness that is the same for
    every direction of a repeat carries no signal).

    Args:
        directions, antithetic: the population's (antithetic sampling recommended).
        shaping: "centered_ranks" (default), "z_score" or "raw".
        weight_decay: L2 coefficient added to the gradient (the paper uses 0.005).
        sigma_schedule: the factor of the initial sigma per step.
        subspace: the share of the perturbed parameters each step perturbs and updates (a random subset of the
            modules per step; 1: all): see :mod:`nesgpu.layers.subspace`.

    Its default optimizer is ``torch.optim.Adam``.
    """

    name = "openai_es"
    default_lr = 0.01
    Options: ClassVar[type] = OpenAIESOptions

    def __init__(self, directions: int, antithetic: bool = True, shaping: str = "centered_ranks",
                 weight_decay: float = 0.0, sigma_schedule: Schedule | None = None, subspace: float = 1.0):
        super().__init__(directions, antithetic, sigma_schedule)
        self.options = OpenAIESOptions(shaping, weight_decay, subspace)
        self.shaping = get_shaping(shaping)
        self.weight_decay = weight_decay

    def make_optimizer(self, parameters, lr: float | None = None) -> torch.optim.Optimizer:
        return torch.optim.Adam(parameters, lr=self.default_lr if lr is None else lr)

    @classmethod
    def lr_for_sigma(cls, sigma: float) -> float:
        """sigma / 10: Adam moves each weight by about lr a step, so a step stays a tenth of the scale at which
        the population just measured the model (measured against sigma / 3 and sigma / 30: BENCHMARKS.md)."""
        return sigma / 10

    def weights(self, fitness: torch.Tensor, sigma: float) -> torch.Tensor:
        shaped = self.shaping(fitness)
        return -(shaped if self.antithetic else centered_per_repeat(shaped))

    @property
    def l2(self) -> float:
        return self.weight_decay

    def regularize(self, parameters) -> None:
        if self.weight_decay:
            for p in parameters:
                if p.grad is not None:
                    p.grad.add_(p.detach(), alpha=self.weight_decay)
