"""What RL runs of each strategy start from is the RL task's knowledge (tasks/rl_options.py), not the strategy's:
every registered strategy resolves to its preset's observation clip and policy output, and a strategy class
carries nothing about RL."""

import pytest

from nesgpu.strategies import STRATEGIES, Strategy
from nesgpu.strategies.ars import ARSOptions
from nesgpu.tasks.rl_options import RL_PRESETS, RLPreset, observation_statistics, preset
from nesgpu.train import TrainConfig


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_run_resolves_to_its_strategys_preset(strategy):
    expected = RL_PRESETS.get(strategy, RLPreset())
    cfg = TrainConfig(task="pendulum", strategy=strategy, hidden=()).resolved()
    assert cfg.option("observation_clip") == expected.observation_clip
    assert cfg.option("policy_output") == ("linear" if expected.linear_policy else "tanh")
    hidden = TrainConfig(task="pendulum", strategy=strategy, hidden=(8,)).resolved()
    assert hidden.option("policy_output") == "tanh"  # a hidden layer: tanh, whatever the preset


def test_the_presets_are_the_papers_and_no_strategy_takes_the_default():
    assert preset("ars") == RLPreset(observation_clip=0.0, linear_policy=True)
    assert preset("openai_es") == preset(None) == RLPreset(observation_clip=5.0, linear_policy=False)
    assert set(RL_PRESETS) <= set(STRATEGIES), "a preset for a strategy that is not registered"


def test_only_ars_v1_uses_raw_observations():
    assert not observation_statistics("ars", ARSOptions(ars_version="v1"))
    assert observation_statistics("ars", ARSOptions(ars_version="v2"))
    assert observation_statistics("openai_es", None) and observation_statistics(None, None)


def test_a_strategy_knows_nothing_of_rl():
    rl_names = {"observation_clip", "linear_policy", "uses_observation_statistics"}
    for cls in (Strategy, *STRATEGIES.values()):
        assert not rl_names & set(vars(cls)), cls.__name__
