"""``--sigma auto``: the noise scale from the model's own response, found by a few population evaluations
before the first step.

Each probe call evaluates the whole population at one sigma on the first step's data and noise (step 1: a task
is only ever asked for its training steps, and a data stream for them in order), through
:meth:`Population.evaluate`, so it is chunked, exchanged between processes and exact like a training step, and
every process finds the same sigma; ``finish=False`` leaves the task as it was. The candidates are a geometric
grid, ``GRID`` (1e-4 to 1, sqrt(10) apart), climbed from the bottom, with one more candidate halfway
(geometrically) where the rule first holds (a reward) or first fails (any other fitness):

- **A reward** (a task that describes ``prompts_with_spread``: the generation tasks): the spread is the share of
  the step's prompts on which the members' rewards differ (a prompt where they all tie carries no signal). One
  call at sigma ``FLOOR`` measures what spreads with no perturbation (sampled completions); the probe takes the
  smallest sigma at which ``REWARD_SPREAD`` of the prompts that sampling leaves tied spread too (with greedy
  decoding: half of all prompts); if none does, the one with the most spread (the smaller on a tie), and says
  so. Where sampling alone spreads half of the prompts, the spread cannot tell sigma: ``FALLBACK``, with a note.
- **Any other fitness**: the plain model's fitness f0 and the evaluation noise come from one call at sigma
  ``FLOOR`` (every member is the plain model there: what still differs between directions is the task's own
  noise). At each candidate, the *signal* is the spread over the directions of their odd response,
  (f+ - f-) / 2 (with antithetic pairs; else of their fitness), and the *drop* is how much worse the average
  member is than f0. The probe takes the largest sigma that is still **local**, drop <= signal (the response's
  curvature no larger than its slope: past it the population measures a smoothed model more than this one),
  and **heard**, signal > ``NOISE_RATIO`` x noise; the climb stops at the first candidate that is not local.

The rule for the step size that follows (``--lr auto``) is the strategy's :meth:`Strategy.lr_for_sigma`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from .population import DescribesFitness, Population
from .strategies.base import check_fitness

GRID = tuple(10 ** (k / 2) for k in range(-8, 1))  # 1e-4, 3.2e-4, ..., 0.32, 1
FLOOR = 1e-9  # a sigma at which every member is the plain model, up to rounding
REWARD_SPREAD = 0.5
FALLBACK = 0.01  # a reward whose spread cannot tell sigma (sampling alone spreads it): a guess, said as one
NOISE_RATIO = 2.0
PROBE_STEP = 1  # the first training step's data and noise


@dataclass(frozen=True)
class Probe:
    """What the probe measured and chose (recorded in summary.json and the checkpoint).

    Attributes:
        sigma: the chosen sigma.
        measure: ``"prompts_with_spread"`` (a reward) or ``"local_response"`` (any other fitness).
        tried: each candidate's sigma and measurements, in the order evaluated.
        note: why the choice is a fallback, if it is ("" when the rule was met).
        seconds: the probe's wall time (its evaluations; the first step's time includes it).
    """

    sigma: float
    measure: str
    tried: list[dict] = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> Probe:
        return cls(float(values["sigma"]), str(values["measure"]), list(values.get("tried", [])),
                   str(values.get("note", "")), float(values.get("seconds", 0.0)))


def probe_sigma(population: Population, task) -> Probe:
    """The sigma at which ``population``'s members respond to ``task`` (see the module's rule). The task is left
    as it was (no ``finish_step``)."""
    started = time.perf_counter()
    if isinstance(task, DescribesFitness) and "prompts_with_spread" in task.describes:
        probe = _probe_reward(population, task)
    else:
        probe = _probe_response(population, task)
    return dataclasses.replace(probe, seconds=round(time.perf_counter() - started, 3))


def _evaluate(population: Population, task, sigma: float):
    return population.evaluate(task, PROBE_STEP, sigma, finish=False)


def _climb(measure, met) -> tuple[list[dict], float | None]:
    """Measure GRID's candidates from the bottom while ``met(trial)`` is False (at most one past the first that
    meets it); then once more halfway (geometrically) between the last that did not and the first that did.
    (trials in the order measured, the smallest sigma found to meet it or None)."""
    tried, below = [], None
    for sigma in GRID:
        trial = measure(sigma)
        if trial is None:
            break
        tried.append(trial)
        if met(trial):
            if below is not None:
                middle = measure(math.sqrt(below * sigma))
                if middle is not None:
                    tried.append(middle)
                    if met(middle):
                        return tried, middle["sigma"]
            return tried, sigma
        below = sigma
    return tried, None


def _probe_reward(population: Population, task) -> Probe:
    def measure(sigma: float) -> dict:
        info = _evaluate(population, task, sigma).info
        return {"sigma": sigma, "prompts_with_spread": float(info["prompts_with_spread"])}

    plain = measure(FLOOR)  # what spreads with no perturbation: sampled completions (a temperature above 0)
    floor = plain["prompts_with_spread"]
    if floor >= REWARD_SPREAD:
        return Probe(FALLBACK, "prompts_with_spread", [plain],
                     f"{floor:.2f} of the prompts spread with no perturbation at all (sampled completions), so the "
                     f"spread cannot tell sigma; sigma {FALLBACK:g} is a guess: give --sigma")
    target = floor + REWARD_SPREAD * (1 - floor)  # half of the prompts that sampling alone leaves tied
    tried, chosen = _climb(measure, lambda t: t["prompts_with_spread"] >= target)
    tried = [plain, *tried]
    if chosen is not None:
        return Probe(chosen, "prompts_with_spread", tried)
    best = max(tried[1:], key=lambda t: (t["prompts_with_spread"], -t["sigma"]))
    if best["prompts_with_spread"] <= floor:
        note = (f"no sigma up to {GRID[-1]:g} made the members' rewards differ on any probe prompt: the reward "
                f"gives this model no signal (every completion scores alike); sigma {best['sigma']:g} is a guess")
    else:
        note = (f"no sigma reached a spread of {target:.2f} of the prompts; the most was "
                f"{best['prompts_with_spread']:.2f}, at sigma {best['sigma']:g}")
    return Probe(best["sigma"], "prompts_with_spread", tried, note)


def response(fitness: torch.Tensor, antithetic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(odd, even) response per direction of a fitness (R, D): with antithetic pairs (f+ - f-) / 2 and
    (f+ + f-) / 2, the sign's repeats averaged; else the fitness less its mean, and the fitness."""
    if antithetic:
        half = fitness.shape[0] // 2
        plus, minus = fitness[:half].mean(0), fitness[half:].mean(0)
        return (plus - minus) / 2, (plus + minus) / 2
    mean = fitness.mean(0)
    return mean - mean.mean(), mean


def _probe_response(population: Population, task) -> Probe:
    antithetic = population.pm.antithetic
    plain = _evaluate(population, task, FLOOR).fitness.double()
    # a fitness that is not finite for the plain model is the task's (no sigma is to blame): that one error
    check_fitness(plain, PROBE_STEP, plain.shape[-1], antithetic,
                  hint=f"--sigma auto's probe found it at sigma {FLOOR:g}, where every member is the plain model; "
                       f"check the task (or the model's weights)")
    f0 = float(plain.mean())
    noise = float(plain.mean(0).std(unbiased=False))  # what differs between directions with no perturbation

    def measure(sigma: float) -> dict | None:
        fitness = _evaluate(population, task, sigma).fitness.double()
        if sigma == GRID[0]:  # not finite at the smallest candidate (and finite at the plain model): one error
            check_fitness(fitness, PROBE_STEP, fitness.shape[-1], antithetic,
                          hint=f"--sigma auto's probe found it at sigma {sigma:g}, its smallest candidate (the plain "
                               f"model's is finite); give a smaller --sigma")
        odd, even = response(fitness, antithetic)
        signal, drop = float(odd.std(unbiased=False)), f0 - float(even.mean())
        if not math.isfinite(signal + drop):
            return None
        return {"sigma": sigma, "signal": signal, "drop": drop, "local": drop <= signal,
                "heard": signal > NOISE_RATIO * noise}

    tried, past = _climb(measure, lambda t: not t["local"])  # past: the first sigma that is not local
    usable = [t for t in tried if t["local"] and t["heard"] and (past is None or t["sigma"] < past)]
    if usable:
        return Probe(max(t["sigma"] for t in usable), "local_response", tried)
    local = [t for t in tried if t["local"]]
    if local:  # local, never above the noise: the largest local one
        return Probe(max(t["sigma"] for t in local), "local_response", tried,
                     f"no sigma lifted the fitness's spread above {NOISE_RATIO}x its evaluation noise ({noise:.3g}); "
                     f"the largest local one")
    return Probe(GRID[0], "local_response", tried, f"even sigma {GRID[0]:g} is past the local response (the average "
                                                   f"member is worse than the plain model by more than the spread "
                                                   f"between members); the smallest candidate")


def probe_line(probe: Probe) -> str:
    """One line for the console: the chosen sigma and what it rests on."""
    measured = ", ".join(f"{t['sigma']:.2g}: {t['prompts_with_spread']:.2f}" if "prompts_with_spread" in t
                         else f"{t['sigma']:.2g}: {t['signal']:.3g}/{t['drop']:.3g}" for t in probe.tried)
    what = "prompts with spread" if probe.measure == "prompts_with_spread" else "signal/drop"
    calls = len(probe.tried) + (probe.measure != "prompts_with_spread")  # a response's plain call is not in tried
    return (f"sigma auto: {probe.sigma:.3g} after {calls} probe evaluations in {probe.seconds:.1f} s ({what} by "
            f"sigma: {measured})" + (f"; {probe.note}" if probe.note else ""))


__all__ = ["FALLBACK", "FLOOR", "GRID", "NOISE_RATIO", "PROBE_STEP", "Probe", "REWARD_SPREAD", "probe_line",
           "probe_sigma", "response"]
