"""What an older run recorded, read as this version reads its own (nesgpu.train.setup.old_runs). End to end, the
stored runs of tests/train/data/old_runs load, evaluate and resume (tests/train/test_old_run_directories.py)."""

import warnings
from types import SimpleNamespace

import pytest
import torch

from nesgpu.train.setup.old_runs import (OLD_DEFAULTS, OLD_RL_DEFAULTS, recorded, resumed, saved_step_sizes,
                                         warn_unfingerprinted, with_old_defaults)


def test_options_a_run_did_not_record_take_the_values_its_nesgpu_used():
    assert with_old_defaults({"task": "digits"}, supervised=True) == {**OLD_DEFAULTS, "task": "digits"}
    rl = with_old_defaults({"task": "cartpole", "observation_clip": 2.0}, supervised=False)
    assert rl["observation_clip"] == 2.0 and rl["policy_output"] == OLD_RL_DEFAULTS["policy_output"]
    assert rl["update"] == "strategy"  # before --update: the strategy's optimizer stepped .grad


def test_a_recorded_config_keeps_only_its_own_strategys_and_tasks_options(tmp_path):
    values = {"task": "digits", "strategy": "openai_es", "top_b": None, "shaping": "centered_ranks",
              "episodes": None, "batch_size": 128}
    got = recorded(values, tmp_path, "openai_es", "digits", supervised=True)
    assert "top_b" not in got and "episodes" not in got
    assert got["shaping"] == "centered_ranks" and got["batch_size"] == 128 and got["evolve"] == "all"
    assert "evolve" not in recorded(values, tmp_path, "openai_es", "digits")  # supervised not given: no old values


def test_a_resumed_es_run_from_before_update_steps_by_its_strategy_and_backprop_takes_none(tmp_path):
    assert resumed({"task": "digits", "strategy": "openai_es"}, tmp_path, ())["update"] == "strategy"
    assert "update" not in resumed({"task": "digits", "strategy": "backprop"}, tmp_path, ())
    assert resumed({"strategy": "openai_es", "update": "sgd"}, tmp_path, ())["update"] == "sgd"


def test_an_older_checkpoints_step_sizes_come_from_its_lr_schedulers_base_lrs():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)
    optimizer.param_groups[0]["initial_lr"] = 0.5  # what a torch LR scheduler left in the loaded groups
    assert saved_step_sizes({"lr_scheduler": {"base_lrs": [0.25]}}, optimizer) == [0.25]
    assert "initial_lr" not in optimizer.param_groups[0]
    assert saved_step_sizes({"lr": [0.1], "lr_scheduler": {"base_lrs": [0.25]}}, optimizer) == [0.1]
    assert saved_step_sizes({}, optimizer) is None  # the groups' own lr


def test_a_checkpoint_without_a_fingerprint_warns_only_where_the_prompts_repeat(tmp_path):
    with pytest.warns(UserWarning, match="3 rows, 2 distinct"):
        warn_unfingerprinted(SimpleNamespace(prompts=["a", "b", "a"]), tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unfingerprinted(SimpleNamespace(prompts=["a", "b"]), tmp_path)
        warn_unfingerprinted(object(), tmp_path)
