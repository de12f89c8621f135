"""SNES, separable natural evolution strategies (Schaul, Glasmachers and Schmidhuber 2011): a Gaussian search
distribution with a sigma per parameter, its mean and its log-sigma moved along their natural gradients.

Members are theta + sigma * s_r * (S o z_d) (the perturbed model's scales, ``S``, start at 1; ``sigma`` stays
the run's). From NES's rank utilities ``u`` (best first: max(0, ln(n/2 + 1) - ln k), normalised, less 1/n):

    theta <- theta + lr * sigma * S o sum_members u z        (lr: eta_mu, 1 by default; SGD)
    S     <- S o exp(scale_lr / 2 * sum_members u (z o z - 1))

with scale_lr = (3 + ln n) / (5 sqrt n) for n evolving parameters unless given. Antithetic pairs are two
members each (their z o z is the same). Needs a kind that takes a sigma per element (``--layer gaussian``), or
low-rank noise (``--layer lowrank``), whose matrices take S = row x column and a statistic per factor
(:mod:`nesgpu.kinds.lowrank`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..options import check_options, option
from .base import DIVERGED
from .scaled import ScaleAdapting, snes_utilities
from .schedules import Schedule


@dataclass(frozen=True)
class SNESOptions:
    scale_lr: float | None = option(None, "step size of log sigma per parameter (default (3 + ln n) / (5 sqrt n), n "
                                          "the evolving parameters)", above=0)

    def __post_init__(self):
        check_options(self, "snes")


def default_scale_lr(n: int) -> float:
    """SNES's step size of log-sigma for ``n`` parameters, (3 + ln n) / (5 sqrt n)."""
    return (3 + math.log(n)) / (5 * math.sqrt(n))


class SNES(ScaleAdapting):
    """Separable NES over the perturbed model's per-parameter scales (see the module docstring).

    Args:
        directions: the population's directions (2 members each with antithetic pairs).
        num_perturbed: n, the evolving parameters (the default scale_lr needs it).
        scale_lr: the step size of log-sigma (default from n).
    """

    name = "snes"
    outer_scales = True  # S o exp(...) of a row-plus-column statistic stays row x column (low-rank noise)
    Options: ClassVar[type] = SNESOptions
    population_options: ClassVar[tuple[str, ...]] = ("num_perturbed",)

    def __init__(self, directions: int, antithetic: bool = True, num_perturbed: int | None = None,
                 scale_lr: float | None = None, sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        self.competes("ranks its members against each other (its utilities sum to zero)")
        self.options = SNESOptions(scale_lr)
        if scale_lr is None:
            self.evolving(num_perturbed)  # the default scale_lr needs n
        self.scale_lr = default_scale_lr(num_perturbed) if scale_lr is None else scale_lr

    @property
    def divergence_hint(self) -> str:
        """A scale_lr given names it too: a large one takes the scales out of float range within a few steps."""
        if self.options.scale_lr is None:
            return super().divergence_hint
        return (f"{DIVERGED}, or lower --scale-lr, now {self.scale_lr:g} (the step size of log sigma per "
                f"parameter; its default, (3 + ln n) / (5 sqrt n), is at most 0.6)")

    def table(self, device) -> torch.Tensor:
        """NES's utilities (they sum to zero)."""
        return snes_utilities(self.members, device=device)

    def rescale(self, scale: torch.Tensor, statistic: torch.Tensor) -> torch.Tensor:
        """S o exp(scale_lr / 2 * sum u (z o z - 1))."""
        return scale * torch.exp(statistic.to(scale.dtype) * (self.scale_lr / 2))


__all__ = ["SNES", "SNESOptions", "default_scale_lr"]
