"""``--sigma auto``: the noise scale from the model's own response, found by a few population evaluations
before the first step.

Each probe call evaluates the whole population at one sigma on the first step's data and noise (step 1: a task
is only ever asked for its training steps, and a data stream for them in order; a reward's prompts, which any step
may ask for: the first steps' too), through
:meth:`Population.evaluate`, so it is chunked, exchanged between processes and exact like a training step, and
every process finds the same sigma; ``finish=False`` leaves the task as it was. The candidates are a geometric
grid, ``GRID`` (1e-4 to 1, sqrt(10) apart), climbed from the bottom, with one more candidate halfway
(geometrically) next to the choice (a reward) or where the rule first fails (any other fitness):

- **A reward** (a task that describes ``prompts_with_spread``: the generation tasks), read from the raw rewards of
  the first steps' prompts, ``PROBE_PROMPTS`` of them (on 8, neighbouring candidates differ by less than the noise).
  The signal is the spread over the directions of their odd response, (f+ - f-) / 2 of the members' mean rewards:
  one member of a pair beating the other. A sigma too small changes no answer; one too large breaks both members
  of a pair alike (spread, but even: what the antithetic difference cancels). The plain model's call at ``FLOOR``
  gives the odd spread that sampling alone makes (0 with greedy decoding); a candidate is *heard* above
  ``NOISE_RATIO`` x that. The climb goes up the grid until the signal has fallen to half its peak. Each trial also
  counts the members whose mean reward beats the plain model's and those that fall below it: where the net share
  that beats it peaks (at ``MIN_NET`` or more, with half the strongest signal or more), answers past it break
  faster than they improve, and the choice
  stays at or below it: the heard candidate there with the strongest signal (the smaller on a tie). Without such a
  peak (a model whose members mostly fall below it, as where it already half knows a dense reward), the probe takes
  the strongest signal of the climb, after one more candidate halfway to its neighbour with the more signal.
  Where no candidate is heard on those prompts, it climbs again
  on the next steps' prompts too (``MORE_PROMPTS`` in all, from at most ``MORE_STEPS`` steps), and then refuses:
  no sigma would carry signal.
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
MIN_NET = 0.1  # the net share of members above the plain model that caps the choice (not a chance of sampling)
PROBE_PROMPTS = 32  # a reward's candidates are measured on this many prompts (the first steps'): 8 are too noisy
MORE_PROMPTS = 64  # where no candidate carries signal, the probe takes the next steps' prompts too, up to this many
MORE_STEPS = 8  # and at most this many steps' (each candidate is then that many population evaluations)
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


def reward_trial(fitness: torch.Tensor, plain: torch.Tensor, signs: int, sigma: float, noise: float = 0.0) -> dict:
    """What one candidate's raw rewards (signs * prompts, D; ``signs`` 2 with antithetic pairs) say against the plain
    model's (the call at ``FLOOR``, of the same shape): the share of prompts whose rewards spread; the shares of
    members whose mean reward is above and below the plain model's by more than the band, ``NOISE_RATIO`` x
    ``noise`` (sampling's own spread); the spread over the directions of their odd response, ``signal``, and how
    far the average member falls below the plain model, ``drop``."""
    fitness = fitness.double()
    prompts = fitness.shape[0] // signs
    by_prompt = fitness.view(signs, prompts, -1).transpose(0, 1).reshape(prompts, -1)
    gap = fitness.view(signs, prompts, -1).mean(1).flatten() - float(plain.double().mean())
    odd, even = response(fitness, signs == 2)
    band = NOISE_RATIO * noise
    return {"sigma": sigma, "band": band,
            "prompts_with_spread": float((by_prompt.amax(1) > by_prompt.amin(1)).double().mean()),
            "above": float((gap > band).double().mean()), "below": float((gap < -band).double().mean()),
            "signal": float(odd.std(unbiased=False)), "drop": float(plain.double().mean() - even.mean())}


def _odd_spread(plain: torch.Tensor, signs: int) -> float:
    """The spread of the plain population's odd response: what sampling alone gives (0 with greedy decoding)."""
    return float(response(plain.double(), signs == 2)[0].std(unbiased=False))


def _mean_trial(trials: list[dict]) -> dict:
    """One candidate's trials over several steps' prompts as one: shares and drops averaged, signals by their rms."""
    mean = {k: sum(t[k] for t in trials) / len(trials)
            for k in ("prompts_with_spread", "above", "below", "drop", "band")}
    mean["signal"] = math.sqrt(sum(t["signal"] ** 2 for t in trials) / len(trials))
    return {"sigma": trials[0]["sigma"], **{k: round(v, 6) for k, v in mean.items()}}


def _heard(trial: dict) -> bool:
    return trial["signal"] > trial["band"]


def _probe_reward(population: Population, task) -> Probe:
    signs, done = (2 if population.pm.antithetic else 1), {}

    def raw(step: int, sigma: float) -> torch.Tensor:  # each (step, sigma) evaluated once, whichever climb asks
        if (step, sigma) not in done:
            done[step, sigma] = population.evaluate(task, step, sigma, finish=False, shape=False).fitness
        return done[step, sigma]

    prompts = raw(PROBE_STEP, FLOOR).shape[0] // signs

    def steps_for(count: int) -> list[int]:  # the first steps whose prompts make ``count`` (at most MORE_STEPS)
        return list(range(PROBE_STEP, PROBE_STEP + min(MORE_STEPS, max(1, -(-count // prompts)))))

    steps = steps_for(PROBE_PROMPTS)
    probe = _reward_climb(raw, signs, steps)
    if probe is None and len(steps_for(MORE_PROMPTS)) > len(steps):
        steps = steps_for(MORE_PROMPTS)
        probe = _reward_climb(raw, signs, steps, f"no signal on the first {len(steps_for(PROBE_PROMPTS)) * prompts} "
                                                 f"prompts: probed on steps 1-{steps[-1]}")
    if probe is None:
        raise ValueError(
            f"--sigma auto: at no sigma from {GRID[0]:g} to {GRID[-1]:g} did a direction's two members score apart "
            f"(beyond sampling's own spread) on {len(steps) * prompts} prompts (steps {steps[0]}-{steps[-1]}): the "
            f"reward gives this model no signal, and no sigma would train it; sample (--temperature 0.7 "
            f"--generations 4) or score partial answers (a --sigma you give skips this probe)")
    probe.tried[0]["evaluations"] = len(done)  # the plain call's record: what the probe line counts
    return probe


def _reward_climb(raw, signs: int, steps: list[int], note: str = "") -> Probe | None:
    """The climb on the prompts of ``steps`` (see the module's rule; ``raw(step, sigma)``: the raw rewards): the
    probe, with ``note``, or None where no candidate carried signal."""
    plains = {step: raw(step, FLOOR) for step in steps}
    noise = {step: _odd_spread(p, signs) for step, p in plains.items()}

    def measure(sigma: float) -> dict:
        return _mean_trial([reward_trial(raw(step, sigma), plains[step], signs, sigma, noise[step])
                            for step in steps])

    tried = []
    for sigma in GRID:
        tried.append(measure(sigma))
        heard = [t["signal"] for t in tried if _heard(t)]
        if heard and tried[-1]["signal"] <= max(heard) / 2:  # past the peak
            break
    if not any(_heard(t) for t in tried):
        return None
    cap = _cap(tried)
    refined = _refined(tried, measure) if cap == math.inf else None  # below a cap the grid's candidate stands
    tried += [refined] if refined is not None else []
    chosen = _strongest(tried, cap)
    plain = {"sigma": FLOOR, "prompts_with_spread": _mean_trial([reward_trial(p, p, signs, FLOOR, noise[s])
                                                                   for s, p in plains.items()])["prompts_with_spread"]}
    return Probe(chosen["sigma"], "prompts_with_spread", [plain, *tried], note)


def _cap(tried: list[dict]) -> float:
    """The sigma at which the most members beat the plain model net of those that fall below it (the smaller on a
    tie), where that net share reaches ``MIN_NET`` and the signal there half the climb's strongest: past it answers
    break faster than they improve; else (no such peak, or a trickle of wins below the response) no cap."""
    net = max(sorted(tried, key=lambda t: t["sigma"]), key=lambda t: t["above"] - t["below"])
    strong = net["signal"] >= max(t["signal"] for t in tried) / 2
    return net["sigma"] if net["above"] - net["below"] >= MIN_NET and strong else math.inf


def _strongest(tried: list[dict], cap: float = math.inf) -> dict:
    """The heard candidate up to ``cap`` with the strongest odd response (the smaller sigma on a tie)."""
    heard = sorted((t for t in tried if _heard(t) and t["sigma"] <= cap), key=lambda t: t["sigma"])
    return max(heard or sorted(filter(_heard, tried), key=lambda t: t["sigma"]), key=lambda t: t["signal"])


def _refined(tried: list[dict], measure) -> dict | None:
    """One more candidate, halfway (geometrically) between the strongest and its neighbour with the more signal
    (None: it has none)."""
    best = _strongest(tried)
    ordered = sorted(tried, key=lambda t: t["sigma"])
    i = ordered.index(best)
    neighbours = [t for t in (ordered[i - 1] if i else None, ordered[i + 1] if i + 1 < len(ordered) else None) if t]
    if not neighbours:
        return None
    return measure(math.sqrt(best["sigma"] * max(neighbours, key=lambda t: t["signal"])["sigma"]))


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
    reward = probe.measure == "prompts_with_spread"
    shown = [t for t in probe.tried if "above" in t] or probe.tried  # not the plain call (an old record: all)
    measured = ", ".join(_trial_text(t) for t in shown)
    what = "signal (members above/below the plain model)" if reward else "signal/drop"
    # a reward's plain call counts them all (a record from before: one per trial); a response's is not in tried
    calls = probe.tried[0].get("evaluations", len(probe.tried)) if reward else len(probe.tried) + 1
    return (f"sigma auto: {probe.sigma:.3g} after {calls} probe evaluations in {probe.seconds:.1f} s ({what} by "
            f"sigma: {measured})" + (f"; {probe.note}" if probe.note else ""))


def _trial_text(trial: dict) -> str:
    if "above" in trial:
        return f"{trial['sigma']:.2g}: {trial['signal']:.3g} ({trial['above']:.2f}/{trial['below']:.2f})"
    if "prompts_with_spread" in trial:  # a probe recorded before the members were counted
        return f"{trial['sigma']:.2g}: {trial['prompts_with_spread']:.2f}"
    return f"{trial['sigma']:.2g}: {trial['signal']:.3g}/{trial['drop']:.3g}"


__all__ = ["FLOOR", "GRID", "MIN_NET", "MORE_PROMPTS", "MORE_STEPS", "NOISE_RATIO", "PROBE_PROMPTS", "PROBE_STEP",
           "Probe", "probe_line", "probe_sigma", "response", "reward_trial"]
