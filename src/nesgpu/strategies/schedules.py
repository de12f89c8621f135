"""Schedules for sigma and the learning rate: a factor of the initial value as a function of the step."""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("constant", "linear", "cosine", "exponential")


@dataclass(frozen=True)
class Schedule:
    """``factor(step)`` goes from 1 at step 0 to ``final`` at step ``steps`` (then stays there).

    Args:
        kind: "constant", "linear", "cosine" or "exponential".
        final: the factor reached at ``steps`` (ignored by "constant").
        steps: length of the schedule.
    """

    kind: str = "constant"
    final: float = 1.0
    steps: int = 1

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown schedule {self.kind!r}; expected one of {KINDS}")
        if self.steps < 1:
            raise ValueError(f"schedule steps must be >= 1; got {self.steps}")
        if self.kind == "exponential" and self.final <= 0:
            raise ValueError(f"an exponential schedule needs final > 0; got {self.final}")

    def __call__(self, step: int) -> float:
        t = min(max(step, 0), self.steps) / self.steps
        if self.kind == "constant":
            return 1.0
        if self.kind == "linear":
            return 1.0 + (self.final - 1.0) * t
        if self.kind == "cosine":
            return self.final + (1.0 - self.final) * 0.5 * (1.0 + math.cos(math.pi * t))
        return self.final**t
