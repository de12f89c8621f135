"""A run records the paths its options name absolute, so that ``--resume``, ``eval`` and ``play`` work from any
directory; a run written before that (relative paths) is found from the working directory, the directory it
started in (its relative ``out`` tells it) or its parent, and an error names the places tried (issue 55:
``cd elsewhere && nesgpu train --resume /abs/run`` said "model is not a Hugging Face model directory")."""

import json
import os
import subprocess
import sys

import pytest
from conftest import char_tokenizer
from test_generation import tiny_llama

from nesgpu.train.setup.old_runs import located
from nesgpu.train.setup.paths import absolute

pytest.importorskip("transformers")

REWARD = "def correct(completions, answer, **kw):\n    return [float(c == a) for c, a in zip(completions, answer)]\n"


def nesgpu(*args, cwd):
    return subprocess.run([sys.executable, "-m", "nesgpu", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))


def start_directory(path):
    path.mkdir()
    tiny_llama().save_pretrained(path / "model")
    char_tokenizer().save_pretrained(path / "model")
    (path / "train.jsonl").write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    (path / "drift.txt").write_text("some text\n")
    (path / "rewards.py").write_text(REWARD)
    return path


TRAIN = ("train", "--task", "generation", "--model", "hf:model", "--prompts", "train.jsonl", "--drift-text",
         "drift.txt", "--reward", "rewards.py:correct", "--population", "2", "--batch-size", "1", "--max-new-tokens",
         "2", "--sigma", "0.01", "--lr", "0.01", "--log", "none")


def test_a_run_records_absolute_paths_and_resumes_and_evaluates_from_another_directory(tmp_path):
    start, away = start_directory(tmp_path / "start"), tmp_path / "away"
    away.mkdir()
    done = nesgpu(*TRAIN, "--steps", "1", "--out", "runs/a", cwd=start)
    assert done.returncode == 0, done.stderr[-2000:]
    run = start / "runs" / "a"
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == f"hf:{start / 'model'}" and config["out"] == str(run)
    assert (config["prompts"], config["drift_text"]) == (str(start / "train.jsonl"), str(start / "drift.txt"))
    assert config["reward"] == f"{start / 'rewards.py'}:correct"
    resumed = nesgpu("train", "--resume", str(run), "--steps", "2", "--trust-run-code", cwd=away)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["steps"] == 2, resumed.stderr[-2000:]
    evaluated = nesgpu("eval", str(run), "--trust-run-code", cwd=away)
    assert evaluated.returncode == 0 and json.loads(evaluated.stdout)["metric"] == "mean_reward", \
        evaluated.stderr[-2000:]


def older_run(tmp_path, monkeypatch):
    """A run as nesgpu before absolute paths wrote it: every path as given, relative to where it started."""
    from nesgpu.train import TrainConfig, train, trainer

    start = start_directory(tmp_path / "start")
    monkeypatch.chdir(start)
    monkeypatch.setattr(trainer, "with_absolute_paths", lambda cfg: cfg)
    train(TrainConfig.flat(task="generation", model="hf:model", prompts="train.jsonl", drift_text="drift.txt",
                      reward="rewards.py:correct", steps=1, population=2, batch_size=1, max_new_tokens=2, sigma=0.01,
                      lr=0.01, log="none", out="runs/a"), log=lambda *a, **k: None)
    assert json.loads((start / "runs/a/config.json").read_text())["model"] == "hf:model"
    return start


def test_an_older_runs_relative_paths_are_found_from_the_directory_it_started_in(tmp_path, monkeypatch):
    from nesgpu.train.storage.runs import load_run

    start = older_run(tmp_path, monkeypatch)
    away = tmp_path / "away"
    away.mkdir()
    monkeypatch.chdir(away)
    assert load_run(start / "runs/a").config.option("prompts") == str(start / "train.jsonl")
    resumed = nesgpu("train", "--resume", str(start / "runs/a"), "--steps", "2", "--trust-run-code", cwd=away)
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["steps"] == 2, resumed.stderr[-2000:]
    assert f"importing {start / 'rewards.py'} for the reward function rewards.py:correct" in resumed.stderr
    changes = resumed.stderr.split("resuming")[1].splitlines()[0]  # the paths, found, are no change
    assert "steps: 1 -> 2" in changes and "prompts" not in changes and "drift_text" not in changes


def test_an_older_run_moved_away_from_its_files_names_the_places_tried(tmp_path, monkeypatch):
    start = older_run(tmp_path, monkeypatch)
    moved = tmp_path / "moved"
    (start / "runs/a").rename(moved)
    done = nesgpu("train", "--resume", str(moved), "--steps", "2", "--trust-run-code", cwd=tmp_path)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 2, done.stderr[-2000:]
    error = done.stderr.strip().splitlines()[-1]
    assert f"{moved / 'config.json'} names model 'hf:model'" in error
    assert f"not at {tmp_path / 'model'} nor" not in error and f"not at {tmp_path / 'model'}" in error
    assert "run this from that directory" in error


def test_relative_paths_are_looked_for_here_then_where_the_run_started_then_beside_it(tmp_path, monkeypatch):
    here, start = tmp_path / "here", tmp_path / "start"
    run = start / "runs" / "a"
    for directory in (here, run):
        directory.mkdir(parents=True)
    for file in (here / "p.jsonl", start / "q.jsonl", start / "r.py", start / "runs" / "d.txt"):
        file.touch()
    monkeypatch.chdir(here)
    values = {"out": "runs/a", "prompts": "p.jsonl", "eval_prompts": "q.jsonl", "drift_text": "d.txt",
              "model": "hf:/abs/m", "reward": "mod:f, r.py:g"}
    found = located(values, run)
    assert found == {**values, "prompts": str(here / "p.jsonl"), "eval_prompts": str(start / "q.jsonl"),
                     "drift_text": str(start / "runs" / "d.txt"), "reward": f"mod:f,{start / 'r.py'}:g"}
    with pytest.raises(ValueError) as missing:
        located({**values, "prompts": "gone.jsonl"}, run)
    assert str(missing.value).startswith(f"{run / 'config.json'} names prompts 'gone.jsonl': gone.jsonl is relative")
    tried = f"{here / 'gone.jsonl'} nor {start / 'gone.jsonl'} nor {start / 'runs' / 'gone.jsonl'};"
    assert tried in str(missing.value)
    assert located({**values, "prompts": "gone.jsonl"}, run, optional=("prompts",))["prompts"] == "gone.jsonl"
    assert absolute({"out": "r", "model": "hf:m", "prompts": None}, here) == \
        {"out": str(here / "r"), "model": f"hf:{here / 'm'}", "prompts": None}
