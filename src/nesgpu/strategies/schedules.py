"""Schedules for sigma and the learning rate: a factor of the initial value as a function of the step."""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("constant", "linear", "cosine", "exponential", "rsqrt")
RSQRT_HOLD = 100  # rsqrt: the steps at the full value before the 1 / sqrt(step) decay


@dataclass(frozen=True)
class Schedule:
    """``factor(step)`` goes from 1 at step 0 to ``final`` at step ``steps`` (then stays there); "rsqrt" instead
    holds 1 for ``RSQRT_HOLD`` steps, then decays as sqrt(RSQRT_HOLD / step), whatever the run's length (the
    stochastic-approximation rate for noisy gradients; a time-budgeted run's --steps says nothing of its length).

    Args:
        kind: "constant", "linear", "cosine", "exponential" or "rsqrt".
        final: the factor reached at ``steps`` (ignored by "constant" and "rsqrt").
        steps: length of the schedule (ignored by "rsqrt").
    """

    kind: str = "constant"
    final: float = 1.0
    steps: int = 1

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.kind!r}; expected one of {SCHEDULES}")
        if self.steps < 1:
            raise ValueError(f"schedule steps must be >= 1; got {self.steps}")
        if self.kind == "exponential" and self.final <= 0:
            raise ValueError(f"an exponential schedule needs final > 0; got {self.final}")

    def __call__(self, step: int) -> float:
        if self.kind == "rsqrt":
            return min(1.0, math.sqrt(RSQRT_HOLD / max(step, 1)))
        t = min(max(step, 0), self.steps) / self.steps
        if self.kind == "constant":
            return 1.0
        if self.kind == "linear":
            return 1.0 + (self.final - 1.0) * t
        if self.kind == "cosine":
            return self.final + (1.0 - self.final) * 0.5 * (1.0 + math.cos(math.pi * t))
        return self.final**t


class StepSizes:
    """The step size of each of an optimizer's parameter groups: a base value times the schedule's factor at
    the step. The one lr mechanism of ES and backprop runs: :meth:`apply` sets the groups' lr for a step.

    Args:
        optimizer: any torch optimizer; its groups' current lr are the bases unless ``bases`` are given.
        schedule: the factor per step (None: constant).
    """

    def __init__(self, optimizer, schedule: Schedule | None = None, bases: list[float] | None = None):
        self.optimizer, self.schedule = optimizer, schedule
        self.bases = [group["lr"] for group in optimizer.param_groups] if bases is None else list(bases)

    def factor(self, step: int) -> float:
        return 1.0 if self.schedule is None else self.schedule(step)

    def value(self, step: int) -> float:
        """The first group's step size at ``step`` (completed steps)."""
        return self.bases[0] * self.factor(step)

    def apply(self, step: int) -> None:
        """Set every group's lr for the step after ``step`` completed ones."""
        factor = self.factor(step)
        for group, base in zip(self.optimizer.param_groups, self.bases):
            group["lr"] = base * factor

    def set_base(self, lr: float, step: int) -> None:
        """A new base step size from ``step`` on: the first group gets ``lr`` and every other group keeps its
        ratio to the first. A group with a ``max_speed`` (ClipUp: twice the step size) has it scaled by the
        same factor."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"lr must be a positive number; got {lr!r}")
        ratio = lr / self.bases[0]
        for group in self.optimizer.param_groups:
            if "max_speed" in group:
                group["max_speed"] = group["max_speed"] * ratio
        self.bases = [base * ratio for base in self.bases]
        self.apply(step)

    def load(self, saved, step: int) -> None:
        """Bases from a checkpoint's ``lr`` (a list per group, or one number; None: the groups' current lr,
        as an optimizer's loaded state has them), applied at ``step``."""
        groups = self.optimizer.param_groups
        if saved is None:
            bases = [group["lr"] for group in groups]
        else:
            bases = list(saved) if isinstance(saved, (list, tuple)) else [float(saved)] * len(groups)
        if len(bases) != len(groups):
            raise ValueError(f"the state has {len(bases)} parameter groups' step sizes; the optimizer has "
                             f"{len(groups)}")
        self.bases = [float(b) for b in bases]
        self.apply(step)
