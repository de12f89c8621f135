"""--sigma auto: the probe finds the sigma at which the population's members respond, by the rule it states, the
same chunked or not, and leaves the task as it was; the trainer takes it (and lr from it) before a new run's
first step, records it, and a resumed run keeps it."""

import math

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.population import Population
from nesgpu.probe import FLOOR, GRID, MORE_PROMPTS, PROBE_STEP, Probe, probe_line, probe_sigma, response
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


class ShapedReward(QuantisedReward):
    """Rewards by rule, on every prompt alike: at sigma s, in a share ``odd(s)`` of the directions the + member scores
    1 and the - member 0 (a response: signal), in a share ``even(s)`` both score -1 (broken answers: spread, but no
    signal), elsewhere both 0, as the plain model does; from step ``first`` on only (0 before)."""

    def __init__(self, odd, even=lambda s: 0.0, first=1, noise=False, pair=(1.0, 0.0)):
        super().__init__()
        self.odd, self.even, self.first, self.noise, self.pair = odd, even, first, noise, pair

    def fitness(self, pm, step):
        self.steps.append(step)
        d = pm.local_directions
        members = torch.zeros(2, d, dtype=torch.float64)
        if step >= self.first and pm.sigma > 1e-6:
            up, broken = round(self.odd(pm.sigma) * d), round(self.even(pm.sigma) * d)
            members[0, :up], members[1, :up] = self.pair
            members[:, d - broken:] = -1.0
        fitness = members.view(2, 1, d).expand(2, PROMPTS, d).reshape(2 * PROMPTS, d).clone()
        if self.noise:  # sampled completions: members differ on some prompts with no perturbation at all
            gen = torch.Generator().manual_seed(step * 1000 + round(1e4 * pm.sigma))
            fitness += 0.2 * torch.randint(0, 2, fitness.shape, generator=gen).double()
        return fitness, {}


def bump(peak, height=0.5, width=2.0):
    return lambda s: max(0.0, height - abs(math.log10(s / peak)) / width)


def test_a_reward_takes_the_sigma_of_the_strongest_odd_response():
    task = ShapedReward(bump(0.01))
    probe = probe_sigma(population(), task)
    assert probe.measure == "prompts_with_spread" and not probe.note
    assert probe.sigma == pytest.approx(0.01)
    assert [t["sigma"] for t in probe.tried[1:]] == list(GRID[:7])  # to 0.1, where the signal fell below half its peak
    assert set(task.steps) == {1, 2, 3, 4} and task.finished == 0  # the first 32 prompts; the task left as it was


def test_where_members_mostly_fall_below_the_plain_model_one_more_candidate_refines_the_choice():
    task = ShapedReward(bump(0.01), pair=(0.0, -1.0))  # a model that half knows the task: members only lose
    probe = probe_sigma(population(), task)
    assert all(t["above"] == 0 for t in probe.tried[1:])
    assert [t["sigma"] for t in probe.tried[1:-1]] == list(GRID[:7])
    assert probe.tried[-1]["sigma"] == pytest.approx(math.sqrt(GRID[4] * GRID[3]))  # to the neighbour with more
    assert probe.sigma == pytest.approx(0.01)  # (a tie: below), which has less signal


def test_broken_answers_spread_the_rewards_but_carry_no_signal():
    task = ShapedReward(bump(0.003, width=1.0), even=lambda s: 0.5 if s > 0.005 else 0.0)  # half broken from 0.01
    probe = probe_sigma(population(), task)
    broken = next(t for t in probe.tried if t["sigma"] == GRID[4])
    assert broken["prompts_with_spread"] == 1 and broken["below"] == 0.5 and broken["signal"] == 0
    assert probe.sigma == pytest.approx(GRID[3])  # the response's peak, not where answers break


class CliffReward(ShapedReward):
    """From sigma 0.002 half the directions respond, + member 1 and - member 0; past 0.015 the response grows (+1 and
    -1) but the other half break (both -1): more signal, and more members below the plain model than above it."""

    def __init__(self):
        super().__init__(lambda s: 0.0)

    def fitness(self, pm, step):
        self.steps.append(step)
        d, s = pm.local_directions, pm.sigma
        members = torch.zeros(2, d, dtype=torch.float64)
        if s > 0.002:
            members[0, :d // 2] = 1.0
        if s > 0.015:
            members[1, :d // 2] = -1.0
            members[:, d // 2:] = -1.0
        return members.view(2, 1, d).expand(2, PROMPTS, d).reshape(2 * PROMPTS, d).clone(), {}


def test_the_choice_stays_where_the_most_members_beat_the_plain_model_net_of_those_below():
    probe = probe_sigma(population(), CliffReward())
    stronger = next(t for t in probe.tried if t["sigma"] == GRID[5])
    chosen = next(t for t in probe.tried if t["sigma"] == probe.sigma)
    assert stronger["signal"] > chosen["signal"] and stronger["below"] > stronger["above"]
    assert probe.sigma == pytest.approx(GRID[3])  # the smaller of the two where the net share peaks


def test_a_reward_with_no_signal_on_the_first_prompts_looks_at_the_next_steps():
    task = ShapedReward(bump(0.01), first=5)
    probe = probe_sigma(population(), task)
    assert set(task.steps) == set(range(1, 9))  # 64 prompts
    assert probe.note == "no signal on the first 32 prompts: probed on steps 1-8"
    assert len(task.steps) == probe.tried[0]["evaluations"]  # steps 1-4 not evaluated again by the second climb
    assert probe.sigma == pytest.approx(0.01)


def test_a_reward_that_never_spreads_is_refused_with_what_to_change():
    task = QuantisedReward(quantum=1e9, offset=5e8)  # every member scores 0 at every sigma
    with pytest.raises(ValueError, match=f"at no sigma from {GRID[0]:g} to {GRID[-1]:g} did a direction's two members "
                                         f"score apart .* on {MORE_PROMPTS} prompts .steps 1-8.*--temperature"):
        probe_sigma(population(), task)


def test_sampled_rewards_are_read_above_their_own_noise():
    probe = probe_sigma(population(), ShapedReward(bump(0.01), noise=True))
    assert probe.tried[0]["prompts_with_spread"] > 0  # sampling spreads the plain model's members
    assert probe.sigma == pytest.approx(0.01)


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


def test_the_probe_line_says_how_many_members_beat_the_plain_model_at_each_sigma():
    probe = probe_sigma(population(), ShapedReward(bump(0.01)))
    line = probe_line(probe)
    assert line.startswith("sigma auto: 0.01 after 32 probe evaluations") and "0.01: 0.25 (0.25/0.00)" in line  # 8 x 4
    old = Probe(0.01, "prompts_with_spread", [{"sigma": 0.01, "prompts_with_spread": 0.5}])  # recorded before
    assert "(signal (members above/below the plain model) by sigma: 0.01: 0.50)" in probe_line(old)


def own_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def run(tmp_path, name, task, **options):
    cfg = TrainConfig.flat(steps=4, population=16, log="none", out=str(tmp_path / name), **options)
    lines = []
    summary = train(cfg, model=own_model(), task=task, log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    return summary, lines


def test_a_task_of_your_own_probes_sigma_and_takes_lr_from_it(tmp_path):
    task = QuantisedReward()
    summary, lines = run(tmp_path, "run", task)
    probe = summary["sigma_probe"]
    assert summary["sigma"] == probe["sigma"] and summary["lr"] == pytest.approx(probe["sigma"] / 10)
    assert any(line.startswith("sigma auto: ") for line in lines)
    probed, trained = task.steps[:-4], task.steps[-4:]
    assert trained == [1, 2, 3, 4] and set(probed) == {1, 2, 3, 4}  # probed on the first 32 prompts, then steps 1-4
    assert len(probed) == 4 * len(probe["tried"]) == probe["tried"][0]["evaluations"]  # each on four steps, once


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
