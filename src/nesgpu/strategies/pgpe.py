"""PGPE (Sehnke et al. 2010, "Parameter-exploring policy gradients") with the ClipUp optimizer
(Toklu et al. 2020) and an adaptive sigma.

nesgpu's sigma is one scalar for all parameters (structured noise needs a shared scale), so sigma adapts
by PGPE's rule summed over parameters: it grows when members whose noise is larger than typical
(||z_d||^2 > n) do better, and shrinks otherwise. The signal is standardised, sqrt(n/2) (||z_d||^2/n - 1),
and each change is capped at ``max_sigma_change`` of sigma. Shared-noise kinds (permuted, flip-out) give
every direction the same ||z_d||, so with them sigma stays put.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from ..model import PerturbedModel
from .base import Strategy, antithetic_halves
from .clipup import ClipUp
from .schedules import Schedule
from .shaping import get_shaping


class PGPE(Strategy):
    """Symmetric-sampling PGPE: g = -1/(D sigma) sum_d (u+_d - u-_d)/2 z_d, then ClipUp (by default).

    Args:
        pm: the perturbed model; must use antithetic (symmetric) sampling.
        optimizer: default ``ClipUp(lr=lr, max_speed=max_speed)``.
        lr, max_speed: ClipUp's step size (default 0.15) and speed cap (default 2 * lr).
        sigma_lr: step size of the sigma adaptation (0 keeps sigma fixed).
        max_sigma_change: cap on the relative change of sigma per step.
        shaping: fitness shaping, "centered_ranks" by default.
    """

    name = "pgpe"
    default_lr = 0.15
    config_options: ClassVar[dict[str, str]] = {"shaping": "shaping"}

    def __init__(self, pm: PerturbedModel, optimizer: torch.optim.Optimizer | None = None, lr: float | None = None,
                 max_speed: float | None = None, sigma_lr: float = 0.1, max_sigma_change: float = 0.2,
                 shaping: str = "centered_ranks", sigma_schedule: Schedule | None = None,
                 lr_schedule: Schedule | None = None):
        if not pm.antithetic:
            raise ValueError("PGPE needs symmetric sampling: PerturbedModel(..., antithetic=True)")
        if sigma_lr and sigma_schedule is not None:
            raise ValueError("PGPE adapts sigma itself: pass sigma_lr=0 to use a sigma_schedule")
        if sigma_lr < 0 or not 0 < max_sigma_change < 1:
            raise ValueError(f"need sigma_lr >= 0 and 0 < max_sigma_change < 1; got {sigma_lr}, {max_sigma_change}")
        lr = self.default_lr if lr is None else lr
        optimizer = optimizer or ClipUp(pm.model.parameters(), lr=lr, max_speed=max_speed)
        super().__init__(pm, optimizer, sigma_schedule, lr_schedule)
        self.sigma_lr = sigma_lr
        self.max_sigma_change = max_sigma_change
        self.shaping = get_shaping(shaping)
        self._utility = None

    def weights(self, fitness):
        plus, minus = antithetic_halves(self.shaping(fitness))
        self._utility = (plus + minus) / 2  # how good direction d is, whichever its sign
        self._sq_norms = []
        return -(plus - minus) / 2

    def on_update_block(self, block):
        if self.sigma_lr:
            self._sq_norms.append(self.pm.noise_sq_norms())

    def after_optimizer_step(self, fitness):
        if not self.sigma_lr:
            return
        n = self.pm.num_perturbed
        radius = (torch.cat(self._sq_norms) / n - 1) * math.sqrt(n / 2)  # ~N(0, 1) per direction
        utility = self._utility - self._utility.mean()
        change = (self.sigma_lr * (utility * radius).mean()).clamp(-self.max_sigma_change, self.max_sigma_change)
        self.pm.sigma = self.pm.sigma * (1 + change.item())  # sigma lives on the host: one read per step
