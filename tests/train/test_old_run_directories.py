"""Run directories written before the configuration held each component's options as its own object (their
config.json names every strategy's and every task's option, flat, None where another's): they load,
evaluate and resume. The directories in data/old_runs were written by that code (an ES, an ARS, a PGPE and
a backprop run, 2026-12-04), less their curve.png."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from nesgpu.cli import main
from nesgpu.train import TrainConfig, load_run
from nesgpu.train.storage.runs import evaluate_run

OLD = Path(__file__).parent / "data" / "old_runs"


@pytest.mark.parametrize("name, strategy, task", [
    ("es_lowrank", "OpenAIESOptions(shaping='centered_ranks', weight_decay=0.005, subspace=1.0)",
     "BatchOptions(batch_size=128)"),
    ("ars_pend", "ARSOptions(top_b=4, ars_version='v2', subspace=1.0)", "observation_clip=0.0)"),
    ("pgpe_cart", "sigma_lr=0.1", "policy_output='tanh', observation_clip=5.0)"),
    ("bp_digits", "BackpropOptions(optimizer='adamw', weight_decay=0.01", "BatchOptions(batch_size=128)"),
])
def test_an_old_run_directory_loads_evaluates_and_resumes(name, strategy, task, tmp_path, capsys):
    run = tmp_path / name
    shutil.copytree(OLD / name, run)
    old = json.loads((run / "config.json").read_text())
    assert "top_b" in old and "episodes" in old and "prompts" in old  # every option, flat
    cfg = TrainConfig.from_dict(old).resolved()
    assert strategy in repr(cfg.strategy_options) and task in repr(cfg.task_options)
    assert load_run(run, "cpu").config == dataclasses.replace(cfg, device="cpu")
    # the summary was written on another CPU: float32 rollouts (a pendulum's 200 steps) round there in other vector
    # kernels (seen: 2e-9 relative on an Intel Xeon against the AMD EPYC that wrote it); same weights, same episodes
    stored = json.loads((run / "summary.json").read_text())["value"]
    assert evaluate_run(run, "cpu")["value"] == pytest.approx(stored, rel=1e-6)
    steps = old["steps"] + 2
    assert main(["train", "--resume", str(run), "--steps", str(steps)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == steps
    new = json.loads((run / "config.json").read_text())
    assert new["steps"] == steps and "prompts" not in new  # now only its own components' options
    assert TrainConfig.from_dict(new).resolved().to_dict() == {**cfg.to_dict(), "steps": steps, "out": str(run)}
