"""--sigma auto: the probe finds the sigma at which the population's members respond, by the rule it states, the
same chunked or not, and leaves the task as it was; the trainer takes it (and lr from it) before a new run's
first step, records it, and a resumed run keeps it."""

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.population import Population
from nesgpu.probe import FALLBACK, FLOOR, GRID, PROBE_STEP, REWARD_SPREAD, Probe, probe_sigma, response
from nesgpu.train import TrainConfig, train

PROMPTS = 8


class QuantisedReward:
    """A reward task in miniature: each "prompt" p scores a member by its output on input p, rounded down to a
    multiple of ``quantum``, so small perturbations tie (as greedy completions do) and larger ones spread."""

    metric, default_target, summed_info = "score", None, frozenset()
    describes = ("prompts_with_spread",)

    def __init__(self, quantum=0.5, offset=0.0):
        self.quantum, self.offset, self.steps, self.finished = quantum, offset, [], 0
        self.x = torch.linspace(-1, 1, PROMPTS * 3, dtype=torch.float64).view(PROMPTS, 3)

    def fitness(self, pm, step):
        self.steps.append(step)
        out = pm(pm.member_rows(self.x)).sum(-1)  # rows (sign, prompt, direction)
        signs = 2 if pm.antithetic else 1
        return torch.floor((out + self.offset) / self.quantum).view(signs * PROMPTS, pm.local_directions), {}

    def describe(self, fitness):
        by_prompt = fitness.view(-1, PROMPTS, fitness.shape[1]).transpose(0, 1).reshape(PROMPTS, -1)
        return {"prompts_with_spread": (by_prompt.amax(1) > by_prompt.amin(1)).double().mean()}

    def finish_step(self, pm, info):
        self.finished += 1

    def evaluate(self, model):
        return 0.0


class Quadratic:
    """Fitness minus the squared distance of the model's output on fixed inputs from a target: deterministic,
    curved, with a slope at the start."""

    metric, default_target, summed_info = "score", None, frozenset()

    def __init__(self):
        self.x = torch.randn(16, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def fitness(self, pm, step):
        out = pm(pm.member_rows(self.x)).view(2 if pm.antithetic else 1, 16, pm.local_directions, 2)
        return -((out - 1.0) ** 2).mean((1, 3)), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return 0.0


def population(chunk=None, directions=12, antithetic=True):
    torch.manual_seed(0)
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)), "lowrank").double()
    pm = nesgpu.PerturbedModel(net, directions, sigma=0.1, antithetic=antithetic, seed=1)
    return Population(pm, chunk=chunk, log=lambda *a: None)


def spread_at(pop, task, sigma):
    return float(pop.evaluate(task, PROBE_STEP, sigma, finish=False).info["prompts_with_spread"])


def test_a_reward_takes_the_smallest_sigma_at_which_half_the_prompts_spread():
    pop, task = population(), QuantisedReward()
    probe = probe_sigma(pop, task)
    assert probe.measure == "prompts_with_spread" and not probe.note
    assert spread_at(pop, task, probe.sigma) >= REWARD_SPREAD
    smaller = [t["sigma"] for t in probe.tried if t["sigma"] < probe.sigma]
    assert smaller and all(spread_at(pop, task, s) < REWARD_SPREAD for s in smaller)
    assert GRID[0] < probe.sigma < GRID[-1]
    assert set(task.steps) == {PROBE_STEP} and task.finished == 0  # the first step's data; the task left as it was


def test_a_reward_that_never_spreads_is_said_in_the_note():
    pop, task = population(), QuantisedReward(quantum=1e9, offset=5e8)  # every member scores 0
    probe = probe_sigma(pop, task)
    assert [t["sigma"] for t in probe.tried] == [FLOOR, *GRID]  # the plain population first
    assert "gives this model no signal" in probe.note


class SampledReward(QuantisedReward):
    """Rewards that differ between members with no perturbation at all, as sampled completions do."""

    def fitness(self, pm, step):
        fitness, info = super().fitness(pm, step)
        gen = torch.Generator().manual_seed(step)
        return fitness + torch.randint(0, 2, fitness.shape, generator=gen).to(fitness), info


def test_a_reward_that_spreads_without_any_perturbation_cannot_tell_sigma_and_says_so():
    probe = probe_sigma(population(), SampledReward())
    assert probe.sigma == FALLBACK and len(probe.tried) == 1 and probe.tried[0]["sigma"] == FLOOR
    assert "spread with no perturbation" in probe.note and "give --sigma" in probe.note


def test_the_probe_is_the_same_chunked_and_not():
    whole, chunked = probe_sigma(population(), QuantisedReward()), probe_sigma(population(chunk=5), QuantisedReward())
    assert whole.sigma == chunked.sigma
    assert [t["sigma"] for t in whole.tried] == [t["sigma"] for t in chunked.tried]


@pytest.mark.parametrize("antithetic", [True, False])
def test_any_other_fitness_takes_the_largest_local_sigma(antithetic):
    pop, task = population(antithetic=antithetic), Quadratic()
    probe = probe_sigma(pop, task)
    assert probe.measure == "local_response" and not probe.note
    chosen = next(t for t in probe.tried if t["sigma"] == probe.sigma)
    assert chosen["local"] and chosen["drop"] <= chosen["signal"]
    if antithetic:  # past it, curvature wins (one-sided, the spread holds the curvature's own variation too)
        assert any(not t["local"] for t in probe.tried if t["sigma"] > probe.sigma)
    f0 = float(pop.evaluate(task, PROBE_STEP, FLOOR).fitness.double().mean())
    odd, even = response(pop.evaluate(task, PROBE_STEP, probe.sigma).fitness.double(), antithetic)
    assert f0 - float(even.mean()) == pytest.approx(chosen["drop"])


def test_response_splits_antithetic_pairs_into_odd_and_even():
    fitness = torch.tensor([[3.0, 1.0], [1.0, 1.0]])  # + sign, - sign
    odd, even = response(fitness, True)
    assert odd.tolist() == [1.0, 0.0] and even.tolist() == [2.0, 1.0]


def test_a_probe_round_trips_through_a_dict():
    probe = Probe(0.01, "prompts_with_spread", [{"sigma": 0.01, "prompts_with_spread": 0.5}], "", 1.5)
    assert Probe.from_dict(probe.as_dict()) == probe


def own_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def run(tmp_path, name, task, **options):
    cfg = TrainConfig(steps=4, population=16, log="none", out=str(tmp_path / name), **options)
    lines = []
    summary = train(cfg, model=own_model(), task=task, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    return summary, lines


def test_a_task_of_your_own_probes_sigma_and_takes_lr_from_it(tmp_path):
    task = QuantisedReward()
    summary, lines = run(tmp_path, "run", task)
    probe = summary["sigma_probe"]
    assert summary["sigma"] == probe["sigma"] and summary["lr"] == pytest.approx(probe["sigma"] / 10)
    assert any(line.startswith("sigma auto: ") for line in lines)
    assert task.steps == [PROBE_STEP] * len(probe["tried"]) + [1, 2, 3, 4]  # probed on step 1, then steps 1-4


def test_a_sigma_you_set_wins_and_nothing_is_probed(tmp_path):
    task = QuantisedReward()
    summary, _ = run(tmp_path, "run", task, sigma=0.05, lr=0.001)
    assert "sigma_probe" not in summary and summary["sigma"] == 0.05 and summary["lr"] == 0.001
    assert task.steps == [1, 2, 3, 4]


def test_a_resumed_run_keeps_the_probed_sigma_and_ends_as_one_run(tmp_path):
    one, _ = run(tmp_path, "one", QuantisedReward())
    cfg = TrainConfig(steps=2, population=16, log="none", out=str(tmp_path / "two"))
    train(cfg, model=own_model(), task=QuantisedReward(), log=lambda *a, **k: None)
    task = QuantisedReward()
    cfg.steps = 4
    two = train(cfg, model=own_model(), task=task, resume=True, log=lambda *a, **k: None)
    assert task.steps == [3, 4]  # not probed again
    assert two["sigma"] == one["sigma"] and two["lr"] == one["lr"]
    assert {**two["sigma_probe"], "seconds": 0} == {**one["sigma_probe"], "seconds": 0}  # the record kept
    a = nesgpu.load_run(tmp_path / "one", model=own_model(), task=QuantisedReward())[0].state_dict()
    b = nesgpu.load_run(tmp_path / "two", model=own_model(), task=QuantisedReward())[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_auto_is_the_default_of_the_generation_tasks_and_of_your_own():
    from nesgpu.train.setup.defaults import presets

    for task in ("arithmetic", "countdown", "generation", "custom:mine"):
        assert presets(task)["sigma"] == "auto" and presets(task)["lr"] == "auto", task
    for task in ("arithmetic", "countdown", "generation"):  # and a decay that does not depend on --steps
        assert presets(task)["lr_schedule"] == "rsqrt", task
    assert presets("arithmetic", strategy="ars")["lr"] == "auto"  # another strategy: its own rule
    assert presets("digits")["sigma"] == 0.1  # a task with a tuned sigma keeps it


@pytest.mark.parametrize("value", ["often", -1.0, 0.0, float("nan")])
def test_a_sigma_that_is_neither_a_number_nor_auto_is_refused(value):
    with pytest.raises(ValueError, match="sigma must be a positive finite number or 'auto'"):
        TrainConfig(sigma=value).resolved()
