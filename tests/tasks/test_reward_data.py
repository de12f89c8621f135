"""TRL's shapes in: prompts as text or chat messages from a list of dicts, a dataset-like object or a JSON-lines
file; every other column reaching each reward function as a keyword list aligned with the completions;
several weighted reward functions; a reward function written for GRPOTrainer unchanged; and --task generation
from the command line, with one-line errors."""

import json
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import char_tokenizer
from test_generation import tiny_llama

from nesgpu import PerturbedModel, convert
from nesgpu.tasks.reward_data import Rewards, dataset_task, load_function, prompt_rows

pytest.importorskip("transformers")

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a % 2} for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]


def grpo_style_correct(completions, answer, **kwargs):
    """Written as for TRL's GRPOTrainer: completions, a dataset column by name, the rest in kwargs."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


def test_every_column_reaches_each_reward_function_aligned_with_its_completion():
    calls = []

    def spy(completions, prompts, answer, level, **kwargs):
        calls.append((list(prompts), list(completions), list(answer), list(level)))
        return [float(len(c)) for c in completions]

    reward = Rewards([spy, grpo_style_correct], {r["prompt"]: r for r in ROWS}, weights=[1.0, 10.0])
    prompts = ["5+6=", "1+2=", "5+6="]
    values = reward(prompts, ["11", "4", "x"])
    assert calls == [(prompts, ["11", "4", "x"], ["11", "3", "11"], [1, 1, 1])]
    assert values.tolist() == [2.0 + 10.0, 1.0, 1.0]


def test_none_is_skipped_and_a_completion_no_function_scores_is_zero_with_one_warning():
    some = Rewards([lambda completions, **kw: [None, 1.0], lambda completions, **kw: [None, None]],
                   {"a": {"prompt": "a"}})
    with pytest.warns(UserWarning, match="every reward function returned None .* it scores 0, as in TRL"):
        values = some(["a", "a"], ["x", "y"])
    assert values.tolist() == [0.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: not at every step
        assert some(["a", "a"], ["x", "y"]).tolist() == [0.0, 1.0]
    assert some.unscored == 2
    with pytest.raises(ValueError, match="must return a list of 2 floats"):
        Rewards(lambda completions, **kw: [1.0], {"a": {"prompt": "a"}})(["a", "a"], ["x", "y"])
    with pytest.raises(TypeError, match="expected a float or None"):
        Rewards(lambda completions, **kw: ["1", 1.0], {"a": {"prompt": "a"}})(["a", "a"], ["x", "y"])


def test_conversational_prompts_render_with_the_chat_template_and_completions_come_back_as_messages():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %}={% endif %}")
    seen = []

    def reward(completions, prompts, **kwargs):
        seen.append((prompts[0], completions[0]))
        return [0.0] * len(completions)

    task = dataset_task([{"prompt": [{"role": "user", "content": "12+3"}]}], tokenizer, reward, max_new_tokens=2,
                        prompts_per_step=1, correct_at=None)
    assert task.prompts == ["12+3="]
    task.reward(["12+3="], ["15"])
    assert seen == [([{"role": "user", "content": "12+3"}], [{"role": "assistant", "content": "15"}])]
    plain = char_tokenizer()
    with pytest.raises(ValueError, match="need a tokenizer with a chat template"):
        dataset_task([{"prompt": [{"role": "user", "content": "1"}]}], plain, reward)


def test_a_dataset_like_object_and_a_jsonl_file_give_the_same_rows(tmp_path):
    class Dataset(list):  # what a datasets.Dataset offers: rows as dicts, and column_names
        column_names = ["prompt", "answer", "level"]

    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    assert prompt_rows(Dataset(ROWS)) == prompt_rows(str(path)) == ROWS
    path.write_text('{"prompt": "1+1="}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"p.jsonl, line 2: not JSON"):
        prompt_rows(str(path))
    with pytest.raises(ValueError, match="row 0 has no 'prompt' column"):
        prompt_rows([{"question": "1+1="}])


def test_a_population_step_scores_every_row_with_its_prompts_columns():
    task = dataset_task(ROWS, char_tokenizer(), [grpo_style_correct], max_new_tokens=3, prompts_per_step=2,
                        correct_at=None, shaping="none")
    pm = PerturbedModel(convert(tiny_llama(), "lowrank"), directions=4, sigma=0.05, antithetic=True)
    pm.set_noise(step=1)
    fitness, info = task.fitness(pm, 1)
    assert fitness.shape == (4, 4) and bool(((fitness == 0) | (fitness == 1)).all())
    assert 0 <= task.evaluate(pm.model) <= 1


def test_what_trl_passes_besides_the_columns_reaches_a_function_that_takes_it():
    """completion_ids (the tokens each completion was decoded from), trainer_state.global_step (the ES step),
    log_metric and log_extra, as GRPOTrainer passes them, to a function that names them; none to one that does
    not."""
    tokenizer, seen = char_tokenizer(), []

    def strict(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, answer, level):
        for text, ids in zip(completions, completion_ids, strict=True):  # up to the token that ends it
            assert tokenizer.decode(ids, skip_special_tokens=True) in (text, text + "\n")
        seen.append(trainer_state.global_step)
        log_metric("length", sum(map(len, completions)) / len(completions))
        log_extra("answer", answer)
        return [float(trainer_state.global_step)] * len(completions)

    def columns_only(completions, prompts, answer, level):  # every column, as TRL passes them
        return [0.0] * len(completions)

    task = dataset_task(ROWS, tokenizer, [strict, columns_only], max_new_tokens=4, prompts_per_step=2,
                        correct_at=None, shaping="none", stop=("\n",))
    assert task.reward.takes_context == {"completion_ids", "step"}
    assert Rewards([columns_only], {}).takes_context == frozenset()  # the task makes no token ids for it
    pm = PerturbedModel(convert(tiny_llama(), "lowrank"), directions=4, sigma=0.5, antithetic=True)
    pm.set_noise(step=5)
    with pytest.warns(UserWarning, match="called log_metric: nesgpu writes log_metric's values to metrics.csv"):
        fitness, _ = task.fitness(pm, 5)
    assert bool((fitness == 5).all()) and seen == [5]
    logged = task.reward.logged
    assert list(logged["metrics"]) == ["length"] and len(logged["extra"]["answer"]) == 2 * 2 * 4
    assert task.evaluate(pm.model) == 5.0 and seen[-1] == 5  # evaluated after step 5
    assert [sample["answer"] for sample in task.samples] == [row["answer"] for row in ROWS]  # log_extra's column


def test_token_ids_are_worked_out_only_when_read_and_a_column_wins_over_an_extra_of_its_name(monkeypatch):
    import nesgpu.tasks.likelihood as likelihood

    calls, seen = [], []
    real = likelihood.kept_tokens
    monkeypatch.setattr(likelihood, "kept_tokens", lambda *a: calls.append(1) or real(*a))

    def kwargs_only(completions, trainer_state, **kwargs):  # a column named trainer_state: the column's values
        seen.append(trainer_state)
        return [0.0] * len(completions)

    rows = [{**row, "trainer_state": "column"} for row in ROWS]
    task = dataset_task(rows, char_tokenizer(), kwargs_only, max_new_tokens=3, prompts_per_step=2, correct_at=None)
    pm = PerturbedModel(convert(tiny_llama(), "lowrank"), directions=2, sigma=0.05, antithetic=True)
    pm.set_noise(step=0)
    task.fitness(pm, 0)
    assert not calls and set(seen[0]) == {"column"}
    ids = likelihood.CompletionIds(char_tokenizer(), torch.tensor([[5, 6]]), ("\n",))  # read: worked out once
    assert len(ids) == 1 and not calls and list(ids) == [[5, 6]] and calls == [1]
    kept = torch.tensor([[True, False]])
    known = likelihood.CompletionIds(char_tokenizer(), torch.tensor([[5, 6]]), ("\n",), kept=kept)
    assert list(known) == [[5]] and calls == [1]  # kept tokens already worked out (the likelihood's draw) are used


def test_numpy_scalars_are_numbers_to_a_reward_and_to_log_metric():
    np = pytest.importorskip("numpy")

    def numpy_valued(completions, log_metric, **kwargs):
        log_metric("half", np.float32(0.5))
        return [np.float32(0.25)] * len(completions)

    rewards = Rewards([numpy_valued], {"p": {"prompt": "p"}})
    with pytest.warns(UserWarning, match="called log_metric"):
        assert rewards(["p", "p"], ["a", "b"]).tolist() == [0.25, 0.25]
    assert rewards.take_metrics() == {"half": 0.5}


def test_log_extra_columns_reach_the_samples_as_json_and_never_the_trainers_keys():
    def logging(completions, log_extra, **kwargs):
        n = len(completions)
        log_extra("odd", [object()] * n)
        log_extra("nan", [float("nan")] * n)
        log_extra("step", [99] * n)  # the trainer's key: left out
        log_extra("short", [1])  # not one per completion: left out
        return [0.0] * n

    task = dataset_task(ROWS, char_tokenizer(), logging, max_new_tokens=2, correct_at=None)
    with pytest.warns(UserWarning, match="called log_extra"):
        task.evaluate(tiny_llama())
    for sample in task.samples:
        json.dumps(sample, allow_nan=False)
        assert sample["odd"].startswith("<object") and sample["nan"] is None
        assert "step" not in sample and "short" not in sample


def test_log_metric_values_become_columns_of_metrics_csv_each_steps_mean_and_survive_a_resume(tmp_path):
    import csv
    import warnings

    from nesgpu.train import TrainConfig, train

    calls, quiet = [], []

    def counting(completions, log_metric, **kwargs):
        calls.append(len(calls))
        if not quiet:
            log_metric("call", len(calls))  # a training step's value: the mean over its calls (its blocks)
        return [float(c.count("1")) for c in completions]

    def run(steps, resume=False):
        task = dataset_task(ROWS, char_tokenizer(), counting, max_new_tokens=2, prompts_per_step=2, correct_at=None)
        cfg = TrainConfig(task="generation", population=4, sigma=0.1, lr=0.01, steps=steps, eval_every=2,
                          chunk_size=1, out=str(tmp_path / "run"), log="none")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "a reward function called log_metric", UserWarning)
            train(cfg, model=tiny_llama(), task=task, resume=resume, log=lambda *a: None)
        with open(tmp_path / "run" / "metrics.csv", newline="") as f:
            return list(csv.DictReader(f))

    rows = run(2)  # step 0: an evaluation (call 1); step 1: two blocks (calls 2, 3); step 2: 4, 5, then eval 6
    assert [r["eval_log_metric/call"] for r in rows] == ["1", "", "6"]
    assert [r["log_metric/call"] for r in rows] == ["", "2.5", "4.5"]
    rows = run(3, resume=True)  # the columns read back; step 3's calls are 8, 9 (7: the first run's final evaluation)
    assert [r["log_metric/call"] for r in rows] == ["", "2.5", "4.5", "8.5"]
    quiet.append(True)
    rows = run(4, resume=True)  # a resume that logs nothing keeps the columns and their values
    assert [r["log_metric/call"] for r in rows] == ["", "2.5", "4.5", "8.5", ""]
    assert [r["eval_log_metric/call"] for r in rows] == ["1", "", "6", "10", ""]
    with pytest.raises(ValueError, match=r"<lambda> raised TypeError: log_metric\('x', value\) needs a number"):
        Rewards([lambda completions, log_metric, **kw: log_metric("x", "high") or [0.0]], {"p": {"prompt": "p"}})(
            ["p"], ["c"])


def test_reward_functions_load_by_module_or_file_with_one_line_errors(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def short(completions, **kw):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    assert load_function("my_rewards:short").__name__ == "short"
    assert load_function(f"{tmp_path / 'my_rewards.py'}:short")(["a"]) == [0.0]
    for spec, message in [("my_rewards", "module:function"), ("my_rewards:long", "has no function 'long'"),
                          ("nowhere_at_all:f", "cannot import 'nowhere_at_all'"), ("gone.py:f", "no file gone.py")]:
        with pytest.raises(ValueError, match=message):
            load_function(spec)


def test_the_cli_trains_on_a_prompts_file_and_reward_functions(tmp_path):
    model_dir = tmp_path / "lm"
    tiny_llama().save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS))
    (tmp_path / "rewards.py").write_text(
        "def correct(completions, answer, **kwargs):\n"
        "    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]\n")

    def nesgpu(*args):
        return subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model",
                               f"hf:{model_dir}", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)

    done = nesgpu("--prompts", "train.jsonl", "--reward", "rewards:correct", "--steps", "2", "--population", "4",
                  "--batch-size", "2", "--max-new-tokens", "3", "--out", "run", "--log", "none")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["metric"] == "mean_reward" and summary["steps"] == 2
    done = nesgpu("--prompts", "train.jsonl", "--reward", "rewards:correct", "--correct-at", "1", "--steps", "1",
                  "--population", "4", "--batch-size", "2", "--max-new-tokens", "3", "--out", "acc", "--log", "none")
    assert done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])["metric"] == "accuracy"
    for args, message in [(["--reward", "rewards:correct"], "needs --prompts FILE.jsonl"),
                          (["--prompts", "missing.jsonl", "--reward", "rewards:correct"], "cannot read the prompts"),
                          (["--prompts", "train.jsonl", "--reward", "rewards:nope"], "has no function 'nope'"),
                          (["--prompts", "train.jsonl", "--reward", "rewards:correct", "--episodes", "2"],
                           "'episodes' (= 2) applies to task")]:
        bad = nesgpu(*args, "--steps", "1", "--out", "bad", "--log", "none")
        assert bad.returncode != 0 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
