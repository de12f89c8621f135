"""An LM run's metrics.csv and progress line under the names a TRL GRPOTrainer user reads (issue 55):
``reward``, ``completions/mean_length`` / ``min_length`` / ``max_length``, ``num_tokens`` (the tokens generated
so far, resumed with the run) and ``learning_rate``; and no column it never fills (no RL or supervised ones).
A run written before these names resumes with its old columns kept."""

import csv

import pytest
import torch
from conftest import char_tokenizer
from test_generation import PROMPTS, digit_count, tiny_llama

from nesgpu.tasks.generation import GenerationTask
from nesgpu.tasks.reward_stats import length_columns, length_counts
from nesgpu.train import TrainConfig, train

pytest.importorskip("transformers")


def task():
    return GenerationTask(prompts=PROMPTS, tokenizer=char_tokenizer(), reward=digit_count, max_new_tokens=5,
                          prompts_per_step=3, correct_at=None, name="digits-count")


def config(out, steps):
    return TrainConfig(steps=steps, population=8, sigma=0.5, lr=0.01, eval_every=2, log="none", progress_every=1e-9,
                       out=str(out))


def header_and_rows(out):
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return list(rows[0]), rows


def test_the_columns_and_the_progress_line_have_trls_names_and_none_stays_empty(tmp_path):
    lines = []
    train(config(tmp_path, 3), model=tiny_llama(), task=task(), log=lines.append)
    header, rows = header_and_rows(tmp_path)
    for name in ("reward", "reward_std", "completions/mean_length", "completions/min_length",
                 "completions/max_length", "num_tokens", "learning_rate", "eval_reward"):
        assert name in header, header
    for old in ("reward_mean", "completion_tokens", "generated_tokens", "lr", "env_steps", "train_loss",
                "episode_return", "test_accuracy", "eval_return"):
        assert old not in header, header
    assert all(any(r[c] != "" for r in rows) for c in header), "a column no row fills"
    tokens = [int(r["num_tokens"]) for r in rows]
    assert tokens[0] == 0 and tokens[1] == 2 * 3 * 4 * 5 and tokens == [tokens[1] * i for i in range(4)]  # a total
    assert all(float(r["learning_rate"]) == 0.01 for r in rows[1:])
    for r in rows[1:]:
        assert float(r["completions/min_length"]) <= float(r["completions/mean_length"]) \
            <= float(r["completions/max_length"]) <= 5
    progress = [line for line in lines if line.startswith("step 1/3")]
    assert " reward " in progress[0] and "completions/mean_length" in progress[0] and "num_tokens 120" in progress[0]


def test_num_tokens_goes_on_from_the_checkpoint_when_resumed(tmp_path):
    train(config(tmp_path, 2), model=tiny_llama(), task=task(), log=lambda *a, **k: None)
    train(config(tmp_path, 3), model=tiny_llama(), task=task(), resume=True, log=lambda *a, **k: None)
    _, rows = header_and_rows(tmp_path)
    assert [int(r["num_tokens"]) for r in rows] == [0, 120, 240, 360]


def test_a_run_from_before_trls_names_resumes_with_its_old_columns(tmp_path):
    train(config(tmp_path, 2), model=tiny_llama(), task=task(), log=lambda *a, **k: None)
    header, rows = header_and_rows(tmp_path)
    old = {"reward": "reward_mean", "completions/mean_length": "completion_tokens", "learning_rate": "lr"}
    with open(tmp_path / "metrics.csv", "w", newline="") as f:  # as an older nesgpu wrote it
        writer = csv.DictWriter(f, [old.get(c, c) for c in header])
        writer.writeheader()
        writer.writerows({old.get(k, k): v for k, v in r.items()} for r in rows)
    train(config(tmp_path, 3), model=tiny_llama(), task=task(), resume=True, log=lambda *a, **k: None)
    header, rows = header_and_rows(tmp_path)
    assert {"reward_mean", "completion_tokens", "lr", "reward", "learning_rate"} <= set(header)
    assert rows[1]["reward_mean"] != "" and rows[3]["reward"] != "" and rows[3]["reward_mean"] == ""


def test_length_counts_give_the_mean_min_and_max():
    counts = length_counts([2, 5, 2, 3], 5) + length_counts([4], 5)
    assert counts.tolist() == [0, 0, 2, 1, 1, 1]
    columns = length_columns(counts)
    assert [float(columns[f"completions/{k}_length"]) for k in ("mean", "min", "max")] == [16 / 5, 2, 5]
    assert all(torch.isnan(v) for v in length_columns(torch.zeros(6)).values())
