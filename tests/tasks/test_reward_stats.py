"""The columns a GRPO user reads, under TRL's names: rewards/<function>/mean and /std (unweighted, None left out,
Bessel's std), frac_reward_zero_std and completions/clipped_ratio; from Python and the CLI, chunked or not, and
across a resume."""

import csv
import json
import math
import subprocess
import sys

import torch
from conftest import char_tokenizer
from test_generation import tiny_llama

from nesgpu.tasks.reward_data import Rewards, dataset_task
from nesgpu.tasks.reward_stats import function_columns, function_names, function_sums, summed_keys

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
REWARDS = ("def ones(completions, **kw):\n    return [float(c.count('1')) for c in completions]\n\n"
           "def short(completions, **kw):\n    return [None if '0' in c else float(len(c)) for c in completions]\n")


def ones(completions, **kw):
    return [float(c.count("1")) for c in completions]


def short(completions, **kw):  # None (not scored) for a completion with a 0 in it: by its content only
    return [None if "0" in c else float(len(c)) for c in completions]


def test_each_functions_mean_and_std_leave_none_out_and_blocks_add_up():
    rewards = Rewards([ones, short], {"p": {"prompt": "p"}}, weights=[1.0, 0.5])
    names = function_names(rewards)
    assert names == ["ones", "short"] and summed_keys(names) >= {"rewards/short/count", "rewards/ones/sum_sq"}
    completions = ["11", "10", "1", "22", "0"]
    total = rewards(["p"] * 5, completions)
    whole = function_sums(rewards, total, names)
    parts = [function_sums(rewards, rewards(["p"] * len(c), c), names) for c in (completions[:2], completions[2:])]
    assert all(torch.equal(whole[k], parts[0][k] + parts[1][k]) for k in whole)
    columns = function_columns(dict(whole), names)
    for name, values in (("ones", [2.0, 1.0, 1.0, 0.0, 0.0]), ("short", [2.0, 1.0, 2.0])):
        want = torch.tensor(values, dtype=torch.float64)
        assert math.isclose(columns[f"rewards/{name}/mean"], want.mean(), rel_tol=1e-12)
        assert math.isclose(columns[f"rewards/{name}/std"], want.std(), rel_tol=1e-12)  # Bessel, as TRL's nanstd
    alone = function_sums(lambda p, c: torch.ones(len(c)), torch.tensor([3.0, 5.0]), ["<lambda>"])
    assert float(function_columns(alone, ["<lambda>"])["rewards/<lambda>/mean"]) == 4.0  # one callable: its total
    nothing = function_sums(rewards, rewards(["p"], ["0"]), names)
    assert math.isnan(function_columns(nothing, names)["rewards/short/mean"])  # scored nothing: NaN, as TRL


def train_rows(out, steps, chunk=None, resume=False):
    from nesgpu.train import TrainConfig, train

    task = dataset_task(ROWS, char_tokenizer(), [ones, short], reward_weights=[1.0, 0.5], max_new_tokens=3,
                        prompts_per_step=2, correct_at=None)  # greedy: chunks evaluate the same completions
    cfg = TrainConfig(task="generation", population=4, sigma=0.1, lr=0.01, steps=steps, chunk_size=chunk,
                      out=str(out), log="none")
    train(cfg, model=tiny_llama(), task=task, resume=resume, log=lambda *a: None)
    with open(out / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


COLUMNS = ("rewards/ones/mean", "rewards/ones/std", "rewards/short/mean", "rewards/short/std",
           "frac_reward_zero_std", "completions/clipped_ratio")


def test_a_run_logs_the_columns_chunked_or_not_and_keeps_them_across_a_resume(tmp_path):
    whole, chunked = train_rows(tmp_path / "whole", 3), train_rows(tmp_path / "chunked", 3, chunk=1)
    assert all(row[c] == other[c] for row, other in zip(whole[1:], chunked[1:]) for c in COLUMNS)
    for row in whole[1:]:
        assert all(row[c] != "" for c in COLUMNS), row
        assert 0 <= float(row["completions/clipped_ratio"]) <= 1 and 0 <= float(row["frac_reward_zero_std"]) <= 1
        assert math.isclose(float(row["frac_reward_zero_std"]), 1 - float(row["prompts_with_spread"]))
    train_rows(tmp_path / "split", 2)
    resumed = train_rows(tmp_path / "split", 3, resume=True)
    assert [r[c] for r in resumed for c in COLUMNS] == [r[c] for r in whole for c in COLUMNS]


def test_the_cli_logs_each_reward_function(tmp_path):
    model_dir = tmp_path / "lm"
    tiny_llama().save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    (tmp_path / "rw.py").write_text(REWARDS)
    done = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model",
                           f"hf:{model_dir}", "--prompts", "train.jsonl", "--reward", "rw:ones,rw:short",
                           "--reward-weights", "1,0.5", "--steps", "2", "--population", "4", "--batch-size", "2",
                           "--max-new-tokens", "3", "--out", "run", "--log", "none"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(rows[-1][c] != "" for c in COLUMNS), rows[-1]
