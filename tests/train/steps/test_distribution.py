"""The search distribution of an ES step is one object (train/steps/distribution.py): chosen once from what the
strategy adapts, it starts the population's scales or covariance, logs their mean scale, and is what a
checkpoint keeps of them; a checkpoint without it is refused with the strategy named."""

import pytest
import torch
from torch import nn

import nesgpu
from conftest import QuadraticTask
from nesgpu.population import Population
from nesgpu.strategies import STRATEGIES
from nesgpu.train.steps.distribution import DiagonalScales, FullCovariance, Isotropic, distribution_for
from nesgpu.train.steps.evolution import EvolutionStep

EXPECTED = {"cma_es": FullCovariance, "xnes": FullCovariance, "snes": DiagonalScales, "cem": DiagonalScales,
            "sep_cma_es": DiagonalScales, "openai_es": Isotropic, "ars": Isotropic, "pgpe": Isotropic}


def step_of(name: str, **options) -> EvolutionStep:
    cls = STRATEGIES[name]
    pm = nesgpu.PerturbedModel(nesgpu.convert(nn.Linear(3, 2).double(), "gaussian"), 8, sigma=0.1,
                               antithetic=cls.default_antithetic, seed=0)
    strategy = cls(8, pm.antithetic, **{o: getattr(pm, o) for o in cls.population_options}, **options)
    return EvolutionStep(QuadraticTask(), Population(pm, log=lambda *a: None), strategy, 0.1)


def test_every_builtin_strategy_gets_the_distribution_it_adapts():
    assert set(EXPECTED) == set(STRATEGIES)
    for name, cls in EXPECTED.items():
        step = step_of(name)
        assert type(step.distribution) is cls, name
        assert type(distribution_for(step.strategy, step.population)) is cls
        assert ("sigma_scale" in step.columns) == cls.adapts
    assert type(step_of("pgpe", sigma_lr=0.1, per_parameter=True).distribution) is DiagonalScales


@pytest.mark.parametrize("name, key", [("snes", "scales"), ("cma_es", "covariance"), ("openai_es", None)])
def test_the_checkpoint_keeps_the_distribution_and_refuses_one_without_it(name, key):
    step = step_of(name)
    row = step.run()
    state = step.state_dict()
    assert {"scales", "covariance"} & set(state) == ({key} if key else set())
    if key is None:
        assert "sigma_scale" not in row
        return
    assert torch.isfinite(torch.as_tensor(row["sigma_scale"])) and row["sigma_scale"] > 0
    fresh = step_of(name)
    with pytest.raises(ValueError, match=rf"the checkpoint.*({key}|sigma).*for strategy '{name}'"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != key})
    fresh.load_state_dict(state)
    fresh.model.load_state_dict(step.model.state_dict())  # as a checkpoint restores the weights beside it
    assert fresh.run() == step.run()
