"""A strategy that adapts a covariance or a sigma per parameter runs on layer gaussian unless the user names a
layer: ``nesgpu train --strategy cma_es`` runs as it is; a layer named that cannot carry it is still refused."""

import os
import subprocess
import sys

import pytest

from nesgpu.train.setup.config import TrainConfig


@pytest.mark.parametrize("strategy", ["cma_es", "sep_cma_es", "cem", "xnes"])
def test_the_default_layer_follows_the_strategy(strategy):
    assert TrainConfig(task="digits", strategy=strategy).resolved().layer == "gaussian"


def test_a_named_layer_is_kept_and_a_strategy_that_needs_none_keeps_lowrank():
    assert TrainConfig(task="digits", strategy="snes").resolved().layer == "lowrank"  # outer-product scales
    assert TrainConfig(task="digits").resolved().layer == "lowrank"
    assert TrainConfig(task="digits", strategy="openai_es", layer="sparse").resolved().layer == "sparse"
    with pytest.raises(ValueError, match="strategy 'cma_es' adapts a covariance, which layer 'lowrank' cannot"):
        TrainConfig(task="digits", strategy="cma_es", layer="lowrank").resolved()


def test_train_with_cma_es_runs_without_naming_a_layer(tmp_path):
    run = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--strategy", "cma_es", "--task", "digits",
                          "--steps", "1", "--hidden", "4", "--population", "8", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stderr
    assert '"layer": "gaussian"' in run.stdout
