"""Ties carry no signal: tied fitness values share one utility, and a step or prompt whose members all tie adds
exactly nothing to .grad, in every shaping and strategy, antithetic or not, chunked or not."""

import pytest
import torch
from scipy.stats import rankdata
from torch import nn

import nesgpu
from nesgpu.kinds import KINDS
from nesgpu.population import Population
from nesgpu.strategies import ARS, PGPE, OpenAIES, centered_ranks
from nesgpu.strategies.shaping import SHAPINGS, centered_per_repeat, tied_ranks

SHAPING_NAMES = sorted(SHAPINGS)


def test_tied_ranks_are_the_mean_of_the_ranks_they_span():
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(0, 5, (40,), generator=gen).double()
    assert torch.equal(tied_ranks(values), torch.from_numpy(rankdata(values.numpy()) - 1))
    assert tied_ranks(torch.tensor([3., 1., 3., 2.])).tolist() == [2.5, 0.0, 2.5, 1.0]


def test_centered_ranks_of_all_equal_fitness_is_exactly_zero():
    # the case: ranked by position, an antithetic step of ties gave every direction -0.29
    assert torch.equal(centered_ranks(torch.zeros(2, 4)), torch.zeros(2, 4))
    for n in (1, 2, 7, 64, 1000):
        assert torch.equal(centered_ranks(torch.full((n,), 0.1)), torch.zeros(n))


@pytest.mark.parametrize("shaping", SHAPING_NAMES)
def test_every_shaping_gives_all_equal_fitness_exactly_zero(shaping):
    for value in (0.0, 0.1, 1.0, -3.7, 1e30):  # 0.1: its mean in float32 differs from it in the last bit
        fitness = torch.full((6, 16), value)
        assert torch.equal(SHAPINGS[shaping](fitness), torch.zeros(6, 16)), value


@pytest.mark.parametrize("shaping", SHAPING_NAMES)
def test_every_shaping_gives_tied_members_one_utility(shaping):
    gen = torch.Generator().manual_seed(1)
    fitness = torch.randint(0, 3, (4, 10), generator=gen).float()  # binary-like rewards: most members tie
    shaped = SHAPINGS[shaping](fitness)
    for value in fitness.unique():
        assert shaped[fitness == value].unique().numel() == 1


def test_a_repeat_that_ties_is_exactly_zero_once_centered():
    u = torch.tensor([[0.1, 0.1, 0.1], [1.0, 2.0, 6.0]])
    out = centered_per_repeat(u)
    assert torch.equal(out[0], torch.zeros(3)) and torch.allclose(out[1], torch.tensor([-2.0, -1.0, 3.0]))


def strategies(directions):
    for shaping in SHAPING_NAMES:
        yield f"openai_es/{shaping}", OpenAIES(directions, True, shaping=shaping)
        yield f"openai_es/{shaping}/one-sided", OpenAIES(directions, False, shaping=shaping)
        yield f"pgpe/{shaping}", PGPE(directions, True, num_perturbed=11, shaping=shaping)
    yield "ars", ARS(directions, True)
    yield "ars/top-2", ARS(directions, True, top_b=2)


@pytest.mark.parametrize("name", [name for name, _ in strategies(8)])
def test_every_strategy_gives_all_tied_fitness_zero_weights(name):
    strategy = dict(strategies(8))[name]
    state = strategy.init(0.1)
    fitness = torch.full((4, 8), 0.3)
    weights, after = strategy.tell(state, fitness, torch.full((8,), 11.0))
    assert torch.equal(weights, torch.zeros_like(weights))
    assert after.sigma == state.sigma  # PGPE: no signal, no change of sigma either


def prompt_contribution(weights, rows, signs):
    """The per-direction weight the rows of one prompt add (w_d = 1/R sum_r s_r w[r, d])."""
    return sum((1 if r < weights.shape[0] // signs or signs == 1 else -1) * weights[r] for r in rows)


@pytest.mark.parametrize("antithetic", [True, False])
def test_a_prompt_whose_members_all_tie_adds_nothing(antithetic):
    from nesgpu.tasks import GenerationTask

    class Tok:
        pad_token_id = 0

    prompts, signs, d = ["a", "b", "c"], 2 if antithetic else 1, 5
    task = GenerationTask(prompts, Tok(), reward=lambda p, c: torch.zeros(len(c)), prompts_per_step=3)
    gen = torch.Generator().manual_seed(0)
    fitness = torch.randint(0, 2, (signs * 3, d), generator=gen).float()
    fitness[1::3] = 0.1  # prompt 1: every member (both signs) scored 0.1
    weights, _ = OpenAIES(d, antithetic).tell(OpenAIES(d, antithetic).init(0.1), task.shape(fitness))
    rows = [1 + 3 * s for s in range(signs)]
    assert torch.equal(prompt_contribution(weights, rows, signs), torch.zeros(d))


class TiedTask:
    """Every member scores the same: no step may move the weights."""

    metric, default_target, summed_info = "score", None, frozenset()

    def fitness(self, pm, step):
        return torch.full((2 if pm.antithetic else 1, pm.local_directions), 0.1), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return 0.0


@pytest.mark.parametrize("strategy,shaping,antithetic,chunk", [
    ("openai_es", "centered_ranks", True, None), ("openai_es", "centered_ranks", False, 3),
    ("openai_es", "z_score", True, 3), ("openai_es", "raw", False, None), ("pgpe", "centered_ranks", True, 3),
    ("ars", None, True, None)])
def test_a_run_whose_members_all_tie_leaves_the_weights_as_they_were(tmp_path, strategy, shaping, antithetic,
                                                                       chunk):
    from nesgpu.train import TrainConfig, train

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lines = []
    options = {} if shaping is None else {"shaping": shaping}
    summary = train(TrainConfig.flat(strategy=strategy, steps=6, population=16, antithetic=antithetic, sigma=0.1,
                                     chunk_size=chunk, log="none", out=str(tmp_path / "run"), **options),
                    model=model, task=TiedTask(), log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    after = nesgpu.load_run(tmp_path / "run", model=nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)),
                            task=TiedTask())[0].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert summary["steps_without_signal"] == 1.0
    warned = [line for line in lines if "carried no signal" in line]
    assert len(warned) == 1 and "raise --sigma" in warned[0] and "to step 5" in warned[0]  # early, and once


def test_zero_weights_add_exactly_nothing_to_grad_for_every_kind():
    for kind in KINDS:  # every registered kind
        net = nesgpu.convert(nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)), kind)
        pm = nesgpu.PerturbedModel(net, 6, sigma=0.1, antithetic=True, seed=0)
        population = Population(pm, chunk=2, log=lambda *a: None)
        pm.set_noise(step=1)
        population.step = 1
        for p in population.parameters():
            p.grad = torch.zeros_like(p)
        population.update(torch.zeros(2, 6), 0.1)
        assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in population.parameters()), kind
