"""Steps that carry no signal: every member tied, so the update's weights are all zero and the step changes
nothing. Each ES step logs ``no_signal`` (1 or 0); :class:`SignalWatch` says so on the console, early, when
most steps have none, with what to change.

Members that all tie at the best fitness the run has seen, after it has seen lower ones, have saturated the
reward (CartPole at 500 of 500, an accuracy of 1): the task is finished, and a larger sigma would not help. The
tasks declare no maximum of their fitness (``default_target`` is the evaluation metric's, gymnasium's
``reward_threshold``, and the fitness may be shifted or penalised), so that is what the watch goes by. Otherwise the
advice follows what the probe of ``--sigma auto`` measured: it chose the sigma of the strongest response, so sigma is
not the cause (and where no member beat the plain model at any sigma, the reward may be saturated). A sigma that
was given is told to be probed."""

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
        rows: the metrics rows of a resumed run (their ``no_signal`` and fitness values are counted as this run's).
    """

    def __init__(self, log, rows=()):
        self.log = log
        self.probe = None  # what --sigma auto measured (a Probe), once it has: the advice reads it
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

    def see(self, step: int, row: dict, probe=None) -> None:
        """The row of a finished step (``no_signal`` absent: not an ES step, nothing counted), and what the probe
        of ``--sigma auto`` measured (None: no probe ran)."""
        self.probe = probe
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
        self.log(f"{said}: every member of the population scored the same, so those steps changed nothing. "
                 + advice(row["sigma"], self.probe))

    @property
    def share(self) -> float | None:
        """The share of the run's steps without signal (None before any ES step)."""
        return self.silent / self.steps if self.steps else None


def advice(sigma: float, probe) -> str:
    """What to change where most steps carry no signal, from what the probe measured (``probe``: a
    :class:`~nesgpu.probe.Probe`, None where sigma was given), never a larger sigma where the probe saw one do worse."""
    if probe is None:
        return (f"The population does not spread at sigma {sigma:.3g}: --sigma auto measures the sigma at which "
                f"members differ (or raise --sigma); for a reward, also sample (--temperature 0.7 --generations 4), "
                f"or score partial answers")
    chosen = next((t for t in reversed(probe.tried) if t["sigma"] == probe.sigma), {})
    larger = sorted((t for t in probe.tried if t["sigma"] > probe.sigma and "above" in t), key=lambda t: t["sigma"])
    if "above" not in chosen:  # a fitness other than a reward, or a probe recorded before members were counted
        return (f"The probe chose sigma {probe.sigma:.3g} on the first step, where the members' fitness spread; the "
                f"ties since then are the task's (a fitness of few values, or one that has saturated): a larger sigma "
                f"measures a smoothed model rather than this one. Make the fitness finer-grained, or stop here")
    seen = (f"on the first step's prompts the probe measured the strongest response at sigma {probe.sigma:.3g} "
            f"(the two members of a direction scoring apart; {chosen['above']:.0%} of the members beat the plain "
            f"model, {chosen['below']:.0%} fell below it)")
    worse = "; ".join(f"at {t['sigma']:.2g}: {t['signal']:.3g} against {chosen['signal']:.3g}" for t in larger[:2])
    said = (f"Sigma is not the cause: {seen}" + (f", and larger sigmas responded less ({worse})" if worse else "")
            + ". A step ties when no member answers its prompts differently from the others; if the metric still "
              "rises, that is expected. To give more steps a signal, sample (--temperature 0.7 --generations 4) or "
              "score partial answers")
    if not any(t.get("above") for t in probe.tried):  # no member ever beat the plain model: a reward at its top?
        said += "; no member beat the plain model at any sigma the probe tried: if the reward is saturated, stop here"
    return said


def _number(value) -> float | None:
    """A fitness statistic of a row (a float, a 0-d tensor's value, or metrics.csv's text), None when absent."""
    if value is None or isinstance(value, str) and not value:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


__all__ = ["FIRST_LOOK", "SignalWatch", "WINDOW", "advice"]
