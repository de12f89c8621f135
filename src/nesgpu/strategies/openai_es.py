"""OpenAI-ES (Salimans et al. 2017, "Evolution Strategies as a Scalable Alternative to Reinforcement
Learning"): centered-rank fitness shaping, mirrored sampling, L2 weight decay, and Adam."""

from __future__ import annotations

from typing import ClassVar

import torch

from ..model import PerturbedModel
from .base import Strategy
from .schedules import Schedule
from .shaping import get_shaping


class OpenAIES(Strategy):
    """g = -1/(D sigma) sum_{r,d} s_r u_{r,d} z_d / R, with u the shaped fitness; then the optimizer steps.

    Args:
        pm: the perturbed model (antithetic sampling recommended).
        optimizer: default ``torch.optim.Adam(lr=lr)`` over the model's parameters.
        lr: learning rate of the default optimizer (default 0.01).
        shaping: "centered_ranks" (default), "z_score" or "raw".
        weight_decay: L2 coefficient added to the gradient (the paper uses 0.005).
    """

    name = "openai_es"
    default_lr = 0.01
    config_options: ClassVar[dict[str, str]] = {"shaping": "shaping", "weight_decay": "weight_decay"}

    def __init__(self, pm: PerturbedModel, optimizer: torch.optim.Optimizer | None = None, lr: float | None = None,
                 shaping: str = "centered_ranks", weight_decay: float = 0.0,
                 sigma_schedule: Schedule | None = None, lr_schedule: Schedule | None = None):
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0; got {weight_decay}")
        optimizer = optimizer or torch.optim.Adam(pm.model.parameters(), lr=self.default_lr if lr is None else lr)
        super().__init__(pm, optimizer, sigma_schedule, lr_schedule)
        self.shaping = get_shaping(shaping)
        self.weight_decay = weight_decay

    def weights(self, fitness):
        return -self.shaping(fitness)

    def before_optimizer_step(self):
        if self.weight_decay:
            for p in self.pm.parameters():
                if p.grad is not None:
                    p.grad.add_(p.detach(), alpha=self.weight_decay)
