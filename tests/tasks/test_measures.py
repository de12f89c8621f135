"""What a language-model run measures beside its reward, on a run with two reward functions: kl each step (0 while
the model is the start), the eval_ columns, pass@k and drift_nll at each evaluation; the same chunked, across a
resume, and from the command line."""

import csv
import json
import subprocess
import sys

import pytest
import torch
from conftest import char_tokenizer
from test_generation import tiny_llama
from test_reward_stats import REWARDS, ROWS, ones, short

from nesgpu.tasks.divergence import drift_nll
from nesgpu.tasks.reward_data import dataset_task

DRIFT = ["12+34=46", "the 7 of 9", "0-1"]
EVAL = ("eval_reward", "eval_reward_std", "eval_rewards/ones/mean", "eval_rewards/short/std",
        "eval_completions/mean_length", "eval_completions/clipped_ratio", "eval_kl", "eval_pass@3", "eval_pass@1",
        "eval_frac_reward_zero_std", "drift_nll", "drift_nll_change")


def run(out, steps, chunk=None, resume=False, **options):
    from nesgpu.train import TrainConfig, train

    options = {"eval_generations": 3, "drift_texts": DRIFT, "kl": True, **options}
    task = dataset_task(ROWS, char_tokenizer(), [ones, short], reward_weights=[1.0, 0.5], max_new_tokens=3,
                        prompts_per_step=2, correct_at=1.0, **options)  # greedy: chunks evaluate the same completions
    cfg = TrainConfig(task="generation", population=4, sigma=0.2, lr=0.05, steps=steps, chunk_size=chunk,
                      eval_every=1, out=str(out), log="none")
    train(cfg, model=tiny_llama(), task=task, resume=resume, log=lambda *a: None)
    with open(out / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]


def test_kl_and_the_evaluation_columns_chunked_resumed_and_from_the_start(tmp_path):
    whole = run(tmp_path / "whole", 3)
    assert all(whole[0][c] != "" for c in EVAL) and whole[0]["kl"] == ""  # step 0: an evaluation, no step
    assert float(whole[0]["eval_kl"]) == 0 and float(whole[0]["drift_nll_change"]) == 0
    assert float(whole[0]["drift_nll"]) == pytest.approx(drift_nll(tiny_llama(), char_tokenizer(), DRIFT), rel=1e-5)
    assert float(whole[1]["kl"]) == 0  # the first step's model is the starting one
    assert float(whole[3]["kl"]) > 0 and float(whole[3]["eval_kl"]) > 0 and float(whole[3]["drift_nll_change"]) != 0
    for row in whole:
        assert float(row["eval_pass@3"]) >= float(row["eval_pass@1"])
        assert float(row["drift_nll"]) - float(row["drift_nll_change"]) == pytest.approx(float(whole[0]["drift_nll"]),
                                                                                          abs=2e-5)
    # the same weights (tests/tasks/test_inplace_generation.py compares them bit for bit), measured in forwards of
    # other batch shapes: a CPU's kernels may round those apart (seen: 3e-7 in drift_nll_change on an Intel Xeon)
    assert close_rows(run(tmp_path / "chunked", 3, chunk=1), whole)
    run(tmp_path / "split", 2)
    assert close_rows(run(tmp_path / "split", 3, resume=True), whole)  # the start and its drift from the checkpoint


def close_rows(rows, expected, rel=1e-5, abs=1e-6):
    """The same rows and columns, each number within ``rel`` (or ``abs`` near zero) of the expected one."""
    assert len(rows) == len(expected) and all(a.keys() == b.keys() for a, b in zip(rows, expected))
    for a, b in zip(rows, expected):
        for key in a:
            if a[key] != b[key]:
                assert float(a[key]) == pytest.approx(float(b[key]), rel=rel, abs=abs), (a["step"], key)
    return True


def test_without_kl_or_drift_nothing_is_kept_or_logged(tmp_path):
    rows = run(tmp_path / "plain", 2, kl=False, drift_texts=None, eval_generations=0)
    assert not {"kl", "eval_kl", "drift_nll", "eval_pass@1"} & set(rows[0])
    state = torch.load(tmp_path / "plain" / "checkpoint" / "state.pt", weights_only=True)["strategy"]
    assert "start" not in state


def test_wrong_measure_options_are_named():
    with pytest.raises(ValueError, match="eval_generations counts correct answers .pass@k.: it needs correct_at"):
        dataset_task(ROWS, char_tokenizer(), ones, eval_generations=2, correct_at=None)
    with pytest.raises(ValueError, match="eval_generations must be an int >= 0"):
        dataset_task(ROWS, char_tokenizer(), ones, eval_generations=-1)
    with pytest.raises(TypeError, match="kl must be True or False; got 'no'"):
        dataset_task(ROWS, char_tokenizer(), ones, kl="no")


def write_run_files(tmp_path) -> None:
    """What a generation run from the CLI reads in ``tmp_path``: the tiny Llama (lm/), train.jsonl and rw.py."""
    tiny_llama().save_pretrained(tmp_path / "lm")
    char_tokenizer().save_pretrained(tmp_path / "lm")
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    (tmp_path / "rw.py").write_text(REWARDS)


def generation_cli(tmp_path, *args):
    """``nesgpu train --task generation`` on :func:`write_run_files`' files, 2 steps of 4 members, and ``args``."""
    return subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model",
                           f"hf:{tmp_path / 'lm'}", "--prompts", "train.jsonl", "--steps", "2", "--population", "4",
                           "--batch-size", "2", "--max-new-tokens", "3", "--log", "none", *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def cli(tmp_path, *args):
    return generation_cli(tmp_path, "--reward", "rw:ones,rw:short", "--reward-weights", "1,0.5", *args)


def test_the_cli_logs_kl_pass_at_k_and_drift(tmp_path):
    write_run_files(tmp_path)
    (tmp_path / "drift.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in DRIFT))
    done = cli(tmp_path, "--kl", "--correct-at", "1", "--eval-generations", "3", "--drift-text", "drift.jsonl",
               "--out", "run")
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(rows[-1][c] != "" for c in (*EVAL, "kl")), rows[-1]
    done = cli(tmp_path, "--no-kl", "--out", "nokl")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kl" not in (tmp_path / "nokl" / "metrics.csv").read_text().splitlines()[0].split(",")
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    for args, message in ((["--drift-text", "bad.jsonl"], "bad.jsonl, line 1: expected an object with a non-empty"),
                          (["--eval-generations", "2"], "it needs correct_at")):
        done = cli(tmp_path, *args, "--out", "bad")
        assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_checkpoint_without_starting_weights_resumes_with_a_warning(tmp_path):
    run(tmp_path / "old", 2, kl=False, drift_texts=None)  # as a run from before the starting weights were kept
    with pytest.warns(UserWarning, match="holds no starting weights .* measured from the model as this run builds"):
        rows = run(tmp_path / "old", 3, resume=True)
    assert rows[-1]["kl"] != "" and rows[-1]["drift_nll_change"] != ""


def test_an_evaluations_log_metric_is_of_its_greedy_completions_only():
    calls = []

    def logs(completions, log_metric, **kw):
        calls.append(len(completions))
        log_metric("rows", float(len(completions)))
        return [0.0] * len(completions)

    task = dataset_task(ROWS, char_tokenizer(), logs, max_new_tokens=2, correct_at=1.0, eval_generations=3)
    task.evaluate(tiny_llama())
    assert calls == [len(ROWS), 3 * len(ROWS)]  # the greedy pass, then the sampled one
    assert task.logged_metrics() == {"rows": float(len(ROWS))} and task.logged_metrics() == {}
