"""``nesgpu train --help`` is the help of the task and strategy in hand: their own options, with their own
defaults, the run options that apply to them, and nothing of the other components, whose options are
refused by name in one line."""

import json
import os
import subprocess
import sys

import pytest

from nesgpu.cli import main
from nesgpu.frontends.train_flags import Chosen, chosen


def helped(*argv: str) -> str:
    """``nesgpu train ARGV --help`` in a fresh process on an 80-column terminal."""
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run([sys.executable, "-m", "nesgpu", "train", *argv, "--help"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def flags(text: str) -> set[str]:
    return {word.rstrip(",") for line in text.splitlines() for word in line.split()[:3] if word.startswith("--")}


def test_cartpoles_help_is_its_own_and_short():
    text = helped("--task", "cartpole")
    assert len(text.splitlines()) < 120
    assert {"--episodes", "--eval-episodes", "--sigma-lr", "--rank"} <= flags(text)  # its task's, pgpe's, lowrank's
    assert not {"--prompts", "--reward", "--batch-size", "--top-b", "--bits", "--preset", "--sparse-k"} & flags(text)
    assert "(default: 0.5)" in text.split("--sigma ")[1].split("--")[0]  # cartpole's sigma, not digits'
    assert "strategy pgpe options" in text and "task cartpole options" in text


def test_generations_help_is_its_own_and_short():
    text = helped("--task", "generation")
    assert len(text.splitlines()) < 135  # its own rows and rewards, LoRA's five (TRL's --use_peft), --engine
    assert {"--prompts", "--reward", "--correct-at", "--kl", "--compile", "--engine"} <= flags(text)
    assert not {"--episodes", "--policy-output", "--observation-clip", "--bits", "--hidden"} & flags(text)
    assert "hf:DIR: a local Hugging Face model directory" in " ".join(text.split())


def test_the_strategy_and_layer_in_hand_choose_their_options():
    text = helped("--task", "pendulum", "--strategy", "ars", "--layer", "sparse")
    assert {"--top-b", "--ars-version", "--sparse-k"} <= flags(text) and "--rank" not in flags(text)
    assert "--shaping" not in flags(text)  # openai_es's and pgpe's
    backprop = helped("--strategy", "backprop")
    assert {"--optimizer", "--accumulate", "--batch-size"} <= flags(backprop)
    assert not {"--sigma", "--population", "--layer", "--rank"} & flags(backprop)  # ES only


def test_the_default_layer_follows_the_strategy_in_help_too():
    assert chosen(["--strategy", "cma_es"]) == Chosen("digits", "cma_es", "gaussian")
    assert chosen(["--strategy", "snes"]).layer == "lowrank"  # its outer-product scales ride on low-rank noise
    assert chosen(["--strategy", "cma_es", "--layer", "sparse"]).layer == "sparse"  # named: kept (and refused)


def test_resuming_a_run_of_a_task_of_ones_own_is_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"task": "custom:toy", "steps": 5}))
    with pytest.raises(SystemExit) as exit_info:  # the --help of its model flag looked the task up: a KeyError
        main(["train", "--resume", str(tmp_path / "run"), "--steps", "7"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "task 'custom:toy' is a task of your own: pass the object (train(cfg, task=...)" in err


def test_a_config_file_or_a_resumed_run_names_the_components(tmp_path):
    (tmp_path / "c.yaml").write_text("task: cartpole\nstrategy: ars\n")
    assert chosen(["--config", str(tmp_path / "c.yaml")]) == Chosen("cartpole", "ars")
    assert chosen(["--config", str(tmp_path / "c.yaml"), "--task", "pendulum"]) == Chosen("pendulum", "ars")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"task": "acrobot", "layer": "gaussian"}))
    assert chosen(["--resume", str(tmp_path / "run")]) == Chosen("acrobot", None, "gaussian")
    assert chosen(["--config", str(tmp_path / "missing.yaml")]) == Chosen()  # named when the run starts
    assert "--episodes" in flags(helped("--config", str(tmp_path / "c.yaml")))
    # a preset's strategy and layer, where the command line does not name them
    assert chosen(["--task", "gym:Hopper-v5", "--preset", "ars-paper"]) == Chosen("gym:Hopper-v5", "ars", "gaussian")
    assert chosen(["--task", "gym:Hopper-v5", "--preset", "ars-paper", "--strategy", "pgpe"]).strategy == "pgpe"


@pytest.mark.parametrize("argv, message", [
    (["--task", "cartpole", "--prompts", "p.jsonl"], "option 'prompts' (= 'p.jsonl') applies to task 'generation'"),
    (["--task", "generation", "--episodes", "x"], "option 'episodes' (= 'x') applies to task 'cartpole' or"),
    (["--task", "digits", "--top-b", "4"], "option 'top_b' (= 4) applies to strategy 'ars', not to strategy "
                                           "'openai_es'"),
    (["--task", "cartpole", "--no-kl"], "option 'kl' (= False) applies to task 'arithmetic' or"),
    (["--task", "gym:Hopper-v5", "--preset", "ars-paper", "--shaping", "raw"], "option 'shaping' (= 'raw') applies "
                                                                               "to strategy 'openai_es' or 'pgpe'"),
    (["--layer", "gaussian", "--rank=2"], "option --rank (= 2) applies to layer 'lowrank', not to layer "
                                          "'gaussian'; drop it or choose --layer lowrank"),
    (["--strategy", "backprop", "--sparse-k", "3"], "option --sparse-k (= 3) applies to layer 'sparse', an ES option"),
    (["--frobnicate", "3"], "error: unrecognized arguments: --frobnicate 3"),
])
def test_another_components_option_is_one_line_naming_its_owner(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", *argv, "--print-config"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
