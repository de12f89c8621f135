"""What a generation run shows its user: the raw reward (mean, std and best over the members), the share of
prompts with any spread and the completion length, in the step's statistics, metrics.csv, the progress line
and curve.png, never the shaped fitness; a step-0 evaluation; a budgeted run's evaluations by time."""

import pytest
import torch
from conftest import char_tokenizer
from test_generation import PROMPTS, digit_count, population, tiny_llama

from nesgpu.tasks.generation import GenerationTask
from nesgpu.train import TrainConfig, train
from nesgpu.train.storage.metrics import MetricsLog

pytest.importorskip("transformers")

SHOWN = ("reward", "reward_std", "reward_best", "prompts_with_spread", "completions/mean_length", "num_tokens")


def task(**kw):
    options = dict(prompts=PROMPTS, tokenizer=char_tokenizer(), reward=digit_count, max_new_tokens=5,
                   prompts_per_step=3, shaping="per_prompt", correct_at=None, name="digits-count")
    return GenerationTask(**{**options, **kw})


def test_describe_reads_the_raw_rewards_of_the_members():
    t = task()
    raw = torch.tensor([[1., 0., 0.], [2., 2., 2.], [0., 0., 3.],  # sign +: prompts 0-2 x directions 0-2
                        [1., 1., 1.], [2., 2., 2.], [0., 0., 0.]], dtype=torch.float64)  # sign -
    stats = t.describe(raw)
    members = torch.tensor([3., 2., 5., 3., 3., 3.], dtype=torch.float64) / 3  # each member's mean over prompts
    assert stats["reward"] == pytest.approx(float(members.mean()))
    assert stats["reward_std"] == pytest.approx(float(members.std(unbiased=False)))
    assert stats["reward_best"] == pytest.approx(5 / 3)
    assert stats["prompts_with_spread"] == pytest.approx(2 / 3)  # prompt 1: every member scored 2


def test_the_step_statistics_are_the_unshaped_rewards():
    t, pop = task(), population()
    result = pop.evaluate(t, 1, 0.5)
    raw = pop.evaluate(task(shaping="none"), 1, 0.5)
    assert set(SHOWN) - {"num_tokens"} | {"env_steps", "completions/min_length", "completions/max_length"} \
        <= set(result.info)  # env_steps: the tokens the step generated, which the run adds up as num_tokens
    assert float(result.info["reward"]) == pytest.approx(float(raw.fitness.mean()))
    assert float(result.info["reward_best"]) == pytest.approx(float(raw.fitness.view(2, 3, 4).mean(1).max()))
    assert abs(float(result.fitness.mean())) < 1e-6  # what the strategy sees is shaped; the user is not shown it
    assert 0 <= result.info["completions/min_length"] <= result.info["completions/mean_length"] \
        <= result.info["completions/max_length"] <= 5
    assert int(result.info["env_steps"]) == 2 * 3 * 4 * 5  # rows x new tokens (no stop before the 5th)


def test_a_run_logs_the_reward_from_step_zero(tmp_path):
    lines = []
    cfg = TrainConfig(steps=3, population=8, sigma=0.5, lr=0.01, eval_every=2, log="none", progress_every=1e-9,
                      out=str(tmp_path))
    train(cfg, model=tiny_llama(), task=task(), log=lines.append)
    rows = MetricsLog.read(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    # before any step: the metric and what the evaluation measured beside it (the model is the starting one)
    assert set(rows[0]) - {"step", "seconds", "num_tokens", "mean_reward"} == {
        "eval_reward", "eval_reward_std", "eval_completions/mean_length", "eval_completions/min_length",
        "eval_completions/max_length", "eval_completions/clipped_ratio",
        "eval_rewards/digit_count/mean", "eval_rewards/digit_count/std", "eval_kl"} and rows[0]["eval_kl"] == 0
    for row in rows[1:]:
        assert set(SHOWN) <= set(row) and row["reward_best"] >= row["reward"] >= 0
        assert 0 <= row["prompts_with_spread"] <= 1
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[0].startswith("step 0/3") and "starting" in progress[0]  # a line before the first step
    assert all(" reward " in line and "fitness" not in line and " ETA " in line for line in progress[1:])
    assert (tmp_path / "curve.png").is_file()


def test_a_budgeted_run_evaluates_every_tenth_of_its_budget(tmp_path, monkeypatch):
    from nesgpu.train import loop

    clock = iter(range(0, 10 ** 6))  # every reading of the clock: one second later
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(clock)))
    cfg = TrainConfig(steps=10 ** 6, time_budget=40.0, population=8, sigma=0.5, log="none", out=str(tmp_path))
    train(cfg, model=tiny_llama(), task=task(), log=lambda *a, **k: None)
    rows = MetricsLog.read(tmp_path / "metrics.csv")
    evaluated = [r["step"] for r in rows if "mean_reward" in r]
    assert evaluated[0] == 0 and len(evaluated) >= 5  # step 0, then about every 4 s of a 40 s budget
    assert max(b - a for a, b in zip(evaluated, evaluated[1:])) < 10 ** 5


def test_a_samples_file_cut_short_by_a_kill_still_resumes(tmp_path):
    cfg = TrainConfig(steps=2, population=8, sigma=0.5, eval_every=1, log="none", out=str(tmp_path))
    train(cfg, model=tiny_llama(), task=task(), log=lambda *a, **k: None)
    samples = tmp_path / "samples.jsonl"
    whole = samples.read_text()
    samples.write_text(whole + '{"step": 3, "prompt": "1+')  # a kill in the middle of a line
    lines = []
    train(TrainConfig(steps=3, population=8, sigma=0.5, eval_every=1, log="none", out=str(tmp_path)),
          model=tiny_llama(), task=task(), resume=True, log=lines.append)
    assert any("its last line was cut short" in line for line in lines)
    first = whole.splitlines()
    first[1] = "not json"
    samples.write_text("\n".join(first) + "\n")
    with pytest.raises(ValueError, match=r"samples.jsonl, line 2, is not a sample .*move the file away"):
        train(TrainConfig(steps=4, population=8, sigma=0.5, eval_every=1, log="none", out=str(tmp_path)),
              model=tiny_llama(), task=task(), resume=True, log=lambda *a, **k: None)
