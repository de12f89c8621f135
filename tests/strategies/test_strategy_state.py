"""A strategy carries a state of its own: a StrategyState subclass with more fields, declared as the strategy's
``State``, made by ``init``, advanced by ``tell``, checkpointed field by field (tensors too) and restored by the
ES step; a checkpoint written before a field existed loads it at its default."""

import dataclasses
import io

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.population import Population
from nesgpu.strategies import OpenAIES, StrategyState
from nesgpu.train.steps.evolution import EvolutionStep


@dataclasses.dataclass(frozen=True)
class BaselineState(StrategyState):
    baseline: float = 0.0  # a running mean of the fitness
    best: torch.Tensor = dataclasses.field(default_factory=lambda: torch.full((1,), -torch.inf))


class BaselineES(OpenAIES):
    """OpenAI-ES that also tracks a running fitness baseline and the best fitness seen (the worked example)."""

    State = BaselineState

    def initial_state(self):
        return {"baseline": 0.0}

    def tell(self, state, fitness, sq_norms=None):
        weights, after = super().tell(state, fitness, sq_norms)
        return weights, dataclasses.replace(after, baseline=0.9 * state.baseline + 0.1 * float(fitness.mean()),
                                            best=torch.maximum(state.best, fitness.max().reshape(1)))


class Quadratic:
    metric, default_target, summed_info = "value", None, frozenset()

    def fitness(self, pm, step):
        x = torch.ones(2 * pm.local_directions, 3)  # two signs x the block's directions
        return -(pm(x) - 1.0).pow(2).mean(-1).view(2, -1), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return 0.0


def es_step(seed=0):
    torch.manual_seed(seed)
    pm = nesgpu.PerturbedModel(nesgpu.convert(nn.Linear(3, 2), "gaussian"), 4, sigma=0.1, antithetic=True,
                               seed=seed)
    return EvolutionStep(Quadratic(), Population(pm, log=lambda *a: None), BaselineES(4), sigma=0.1, lr=0.05)


def test_a_strategys_own_state_is_advanced_checkpointed_and_restored():
    first = es_step()
    assert isinstance(first.state, BaselineState) and first.state.baseline == 0.0
    for _ in range(3):
        first.run()
    assert first.state.step == 3 and first.state.baseline != 0.0 and torch.isfinite(first.state.best).all()
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second = es_step(seed=1)
    second.load_state_dict(torch.load(buffer, weights_only=True))  # tensors in the state: a safe load
    assert isinstance(second.state, BaselineState)
    assert second.state.baseline == first.state.baseline and torch.equal(second.state.best, first.state.best)
    assert second.state.step == 3


def test_a_checkpoint_from_before_the_field_existed_loads_its_default():
    old = {"step": 5, "sigma": 0.2, "sigma0": 0.1, "optimizer": {}}
    state = BaselineState.from_dict(old)
    assert (state.step, state.sigma, state.baseline) == (5, 0.2, 0.0) and state.best.item() == -torch.inf
    with pytest.raises(ValueError, match="strategy state has no 'sigma0'"):
        BaselineState.from_dict({"step": 1, "sigma": 0.1})
