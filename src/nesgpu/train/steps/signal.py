"""Steps that carry no signal: every member tied, so the update's weights are all zero and the step changes
nothing. Each ES step logs ``no_signal`` (1 or 0); :class:`SignalWatch` says so on the console, early, when
most steps have none, with what to change.

Members that all tie at the best fitness the run has seen, after it has seen lower ones, have saturated the
reward (CartPole at 500 of 500, an accuracy of 1): the task is finished, and a larger sigma would not help. The
tasks declare no maximum of their fitness (``default_target`` is the evaluation metric's, gymnasium's
``reward_threshold``, and the fitness may be shifted or penalised), so that is what the watch goes by; a run
tied at one value from its first step cannot tell a saturated reward from a sigma too small, and is told to
raise it."""

from __future__ import annotations

import math
from collections import deque

# the steps looked at: the first warning can come once this many have run; the share is over the latest ones
WINDOW = 10
FIRST_LOOK = 5


class SignalWatch:
    """Counts a run's steps without signal and warns once when more than half of the latest ``WINDOW`` (at
    least ``FIRST_LOOK`` of them) carried none: the reward saturated when most of those tied at the best fitness
    seen (see the module's doc), else sigma is too small to spread the population.

    Args:
        log: where the warning goes (the run's console).
        sigma: the run's sigma, named in the advice (``"auto"``: chosen by the probe).
        rows: the metrics rows of a resumed run (their ``no_signal`` and fitness values are counted as this run's).
    """

    def __init__(self, log, sigma, rows=()):
        self.log, self.sigma = log, sigma
        self.latest: deque[bool] = deque(maxlen=WINDOW)
        self.saturated: deque[bool] = deque(maxlen=WINDOW)
        self.steps = self.silent = 0
        self.best = self.worst = None  # the highest fitness_max and the lowest fitness_min seen
        self.warned = False
        for row in rows:
            if row.get("no_signal") not in (None, ""):
                self._count(bool(float(row["no_signal"])), _number(row.get("fitness_max")),
                            _number(row.get("fitness_min")))

    def _count(self, silent: bool, high: float | None, low: float | None) -> None:
        tied_at_best = (silent and high is not None and self.best is not None and self.worst is not None
                        and self.worst < self.best and high >= self.best - 1e-9 * max(1.0, abs(self.best)))
        self.latest.append(silent)
        self.saturated.append(tied_at_best)
        self.steps += 1
        self.silent += silent
        if high is not None:
            self.best = high if self.best is None else max(self.best, high)
        if low is not None:
            self.worst = low if self.worst is None else min(self.worst, low)

    def see(self, step: int, row: dict) -> None:
        """The row of a finished step (``no_signal`` absent: not an ES step, nothing counted)."""
        if row.get("no_signal") is None:
            return
        self._count(bool(row["no_signal"]), _number(row.get("fitness_max")), _number(row.get("fitness_min")))
        quiet = sum(self.latest)
        if self.warned or len(self.latest) < FIRST_LOOK or 2 * quiet <= len(self.latest):
            return
        self.warned = True
        said = f"warning: {quiet} of the last {len(self.latest)} steps (to step {step}) carried no signal"
        if 2 * sum(self.saturated) > quiet:
            self.log(f"{said}: every member scored {self.best:.4g}, the best this run has seen (from "
                     f"{self.worst:.4g}): the reward is saturated, and the task looks finished, not short of sigma. "
                     f"Stop here (--target ends a run at a metric), or make the task harder (more episodes or "
                     f"prompts, a stricter reward)")
            return
        probed = self.sigma == "auto"
        raise_it = "raise --sigma" if probed else ("raise --sigma (or use --sigma auto, which probes for the sigma at "
                                                   "which members differ)")
        self.log(f"{said}: every member of the population scored the same, so those steps changed nothing. The "
                 f"population does not spread at sigma {row['sigma']:.3g}{' (probed)' if probed else ''}: "
                 f"{raise_it}; for a reward, also sample (--temperature 0.7 --generations 4), give more prompts per "
                 f"step (--batch-size), or score partial answers")

    @property
    def share(self) -> float | None:
        """The share of the run's steps without signal (None before any ES step)."""
        return self.silent / self.steps if self.steps else None


def _number(value) -> float | None:
    """A fitness statistic of a row (a float, a 0-d tensor's value, or metrics.csv's text), None when absent."""
    if value is None or isinstance(value, str) and not value:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


__all__ = ["FIRST_LOOK", "SignalWatch", "WINDOW"]
