"""PGPE (Sehnke et al. 2010, "Parameter-exploring policy gradients") with the ClipUp optimizer
(Toklu et al. 2020) and an adaptive sigma.

By default sigma is one scalar for all parameters (structured noise needs a shared scale), adapted by PGPE's
rule summed over parameters: it grows when members whose noise is larger than typical (||z_d||^2 > n) do
better, and shrinks otherwise. The signal is standardised, sqrt(n/2) (||z_d||^2/n - 1), and each change is
capped at ``max_sigma_change`` of sigma. Shared-noise kinds (permuted, flip-out) give every direction the same
||z_d||, so with them sigma stays put.

With ``per_parameter`` (the paper's and EvoTorch's form; needs ``--layer gaussian``), each parameter has its own
sigma, sigma * S_i (the perturbed model's scales), and the rule applies per entry:
S_i <- S_i (1 + clip(sigma_lr * mean_d u_d (z_di^2 - 1) / sqrt(2), +-max_sigma_change)), u_d the direction's
centred utility (u+_d + u-_d) / 2 and z_d the unit noise; the global sigma stays as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..options import check_options, option
from .base import Strategy, StrategyState, antithetic_halves
from .clipup import ClipUp
from .schedules import Schedule
from .shaping import SHAPINGS, get_shaping


@dataclass(frozen=True)
class PGPEOptions:
    shaping: str = option("centered_ranks", "fitness shaping", choices=tuple(SHAPINGS), defines=True)
    sigma_lr: float = option(0.1, "step size of sigma's adaptation (0: sigma stays fixed)", at_least=0)
    max_sigma_change: float = option(0.2, "cap on the relative change of sigma per step, in (0, 1)", above=0)
    max_speed: float | None = option(None, "ClipUp's speed cap (default: 2 * lr)", above=0)
    per_parameter: bool = option(False, "adapt a sigma per parameter, as the paper (needs --layer gaussian)")

    def __post_init__(self):
        check_options(self, "pgpe")
        if self.max_sigma_change >= 1:
            raise ValueError(f"pgpe: option 'max_sigma_change' must be below 1; got {self.max_sigma_change}")


class PGPE(Strategy):
    """Symmetric-sampling PGPE: g = -1/(D sigma) sum_d (u+_d - u-_d)/2 z_d, then ClipUp (by default).

    Args:
        directions: the population's directions; sampling must be antithetic (symmetric).
        num_perturbed: n, how many scalar parameters are perturbed (the dimension of z_d); needed when
            sigma adapts (``sigma_lr > 0``).
        sigma_lr: step size of the sigma adaptation (0 keeps sigma fixed).
        max_sigma_change: cap on the relative change of sigma per step.
        shaping: fitness shaping, "centered_ranks" by default.
        max_speed: the default optimizer ClipUp's speed cap (default 2 * lr).
    """

    name = "pgpe"
    default_lr = 0.15
    needs_antithetic = True
    Options: ClassVar[type] = PGPEOptions
    population_options: ClassVar[tuple[str, ...]] = ("num_perturbed",)
    adapts_sigma = True

    def __init__(self, directions: int, antithetic: bool = True, num_perturbed: int | None = None,
                 sigma_lr: float = 0.1, max_sigma_change: float = 0.2, shaping: str = "centered_ranks",
                 max_speed: float | None = None, per_parameter: bool = False,
                 sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        self.options = PGPEOptions(shaping, sigma_lr, max_sigma_change, max_speed, per_parameter)
        self.adapts_scales = bool(per_parameter and sigma_lr)
        if sigma_lr and sigma_schedule is not None:
            raise ValueError("PGPE adapts sigma itself: pass sigma_lr=0 to use a sigma_schedule")
        if sigma_lr and not (isinstance(num_perturbed, int) and num_perturbed > 0):
            raise ValueError(f"PGPE's sigma adaptation needs num_perturbed (pm.num_perturbed); got {num_perturbed!r}")
        self.num_perturbed = num_perturbed
        self.sigma_lr = sigma_lr
        self.max_sigma_change = max_sigma_change
        self.shaping = get_shaping(shaping)
        self.max_speed = max_speed

    @classmethod
    def scales_with(cls, options: PGPEOptions) -> bool:
        return bool(options.per_parameter and options.sigma_lr)

    @property
    def needs_sq_norms(self) -> bool:
        return bool(self.sigma_lr) and not self.adapts_scales

    def make_optimizer(self, parameters, lr: float | None = None) -> torch.optim.Optimizer:
        return ClipUp(parameters, lr=self.default_lr if lr is None else lr, max_speed=self.max_speed)

    def tell(self, state: StrategyState, fitness: torch.Tensor, sq_norms: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, StrategyState]:
        fitness = self.check(fitness, state)
        plus, minus = antithetic_halves(self.shaping(fitness))
        weights = -(plus - minus) / 2
        if not self.sigma_lr or self.adapts_scales:  # per parameter: the scales adapt in rescale
            return weights, self.advance(state)
        if sq_norms is None or sq_norms.shape != (self.directions,):
            raise ValueError(f"PGPE's sigma adaptation needs sq_norms of shape ({self.directions},); got "
                             f"{None if sq_norms is None else tuple(sq_norms.shape)}")
        n = self.num_perturbed
        radius = (sq_norms / n - 1) * math.sqrt(n / 2)  # ~N(0, 1) per direction
        utility = (plus + minus) / 2  # how good direction d is, whichever its sign
        utility = utility - utility.mean()
        change = (self.sigma_lr * (utility * radius).mean()).clamp(-self.max_sigma_change, self.max_sigma_change)
        sigma = state.sigma * (1 + change.item())  # sigma lives on the host: one read per step
        return weights, self.advance(state, sigma)

    def scale_weights(self, state: StrategyState, fitness: torch.Tensor) -> torch.Tensor:
        """Per parameter: each direction's centred utility (u+_d + u-_d) / 2, the weights of the statistic
        sum_d u_d (z_d o z_d - 1) that :meth:`rescale` reads."""
        plus, minus = antithetic_halves(self.shaping(self.check(fitness, state)))
        utility = (plus + minus) / 2
        return utility - utility.mean()

    def rescale(self, scale: torch.Tensor, statistic: torch.Tensor) -> torch.Tensor:
        """S o (1 + clip(sigma_lr * statistic / (D sqrt 2), +-max_sigma_change))."""
        change = statistic.to(scale.dtype) * (self.sigma_lr / (self.directions * math.sqrt(2)))
        return scale * (1 + change.clamp_(-self.max_sigma_change, self.max_sigma_change))
