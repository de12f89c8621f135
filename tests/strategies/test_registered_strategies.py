"""Every strategy registered in ``nesgpu.strategies.STRATEGIES`` keeps the Strategy contract, so a new strategy is
tested by being registered: made as the trainer makes it, ``ask`` gives a positive sigma, ``tell`` maps fitness
(R, D) to finite weights of the population's shape and the next state, as a function of its inputs that leaves
the state alone, and a run checkpointed mid-way and restored goes on bit for bit."""

import copy
import io
import math

import pytest
import torch
from torch import nn

import nesgpu
from conftest import QuadraticTask
from nesgpu.population import Population
from nesgpu.strategies import STRATEGIES
from nesgpu.train.steps.evolution import EvolutionStep

NAMES = sorted(STRATEGIES)
D, SIGMA = 8, 0.1


def made(name, weights_seed=0):
    """A float64 Linear(3, 2) (gaussian noise: it carries every strategy's sigma per parameter and covariance) and
    the strategy, made as the trainer makes it (train.setup.build.make_strategy)."""
    cls = STRATEGIES[name]
    torch.manual_seed(weights_seed)
    net = nesgpu.convert(nn.Linear(3, 2).double(), "gaussian")
    pm = nesgpu.PerturbedModel(net, D, sigma=SIGMA, antithetic=cls.default_antithetic, seed=3)
    return pm, cls(D, pm.antithetic, **{option: getattr(pm, option) for option in cls.population_options})


def same(a, b) -> bool:
    a, b = a.as_dict(), b.as_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


@pytest.mark.parametrize("name", NAMES)
def test_ask_and_tell_have_the_populations_shapes_and_are_functions_of_their_inputs(name):
    pm, strategy = made(name)
    state = strategy.init(SIGMA)
    assert state.step == 0 and 0 < float(strategy.ask(state)) < math.inf
    repeats = 2 if pm.antithetic else 1
    pm.set_noise(step=1)
    fitness = torch.randn(repeats, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    sq_norms = pm.noise_sq_norms() if strategy.needs_sq_norms else None
    before = copy.deepcopy(state)
    weights, after = strategy.tell(state, fitness, sq_norms)
    again, after_again = strategy.tell(state, fitness.clone(), None if sq_norms is None else sq_norms.clone())
    assert weights.shape in ((repeats, D), (D,)) and torch.isfinite(weights).all()
    assert torch.equal(weights, again) and same(after, after_again)  # a function of its inputs ...
    assert same(state, before) and after.step == 1  # ... that leaves the state it was given as it was


@pytest.mark.parametrize("name", NAMES)
def test_a_run_checkpointed_mid_way_goes_on_bit_for_bit(name):
    def es_step(weights_seed):
        pm, strategy = made(name, weights_seed)
        return pm, EvolutionStep(QuadraticTask(), Population(pm, log=lambda *a: None), strategy, SIGMA)

    pm, whole = es_step(0)
    for _ in range(3):
        whole.run()
    saved = io.BytesIO()  # as a checkpoint holds them: the strategy's state and the model's weights
    torch.save({"strategy": whole.state_dict(), "model": pm.model.state_dict()}, saved)
    rows = [whole.run() for _ in range(2)]
    pm_resumed, resumed = es_step(1)  # other initial weights: the checkpoint's must replace them
    saved.seek(0)
    checkpoint = torch.load(saved, weights_only=True)
    pm_resumed.model.load_state_dict(checkpoint["model"])
    resumed.load_state_dict(checkpoint["strategy"])
    assert resumed.step == 3
    assert [resumed.run() for _ in range(2)] == rows
    after, after_resumed = pm.model.state_dict(), pm_resumed.model.state_dict()
    assert after.keys() == after_resumed.keys() and all(torch.equal(after[k], after_resumed[k]) for k in after)
