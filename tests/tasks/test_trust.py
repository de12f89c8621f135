"""Files from strangers and a user's own slips, on the language-model path: a model directory's code never
runs (``auto_map`` is refused, never asked about), a reward module leaves the import path as it was, a
chat template or a JSON line that cannot be read is one error, and rewards the statistics cannot hold, rows
the reward cannot tell apart or a prompt the rewards do not hold are named, not silently mis-scored."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import char_tokenizer
from test_generation import tiny_llama

from nesgpu.tasks.generation import GenerationTask
from nesgpu.tasks.reward_data import Rewards, dataset_task, prompt_rows, read_jsonl, render
from nesgpu.tasks.reward_tasks import hf_directory, load_causal_lm, load_tokenizer
from nesgpu.tasks.user_code import code_file, load_function

tf = pytest.importorskip("transformers")

EVIL = "import pathlib\npathlib.Path(__file__).with_name('ran').touch()\n"


def model_dir(path, config_map=None, tokenizer_map=None):
    tiny_llama().save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    for name, auto_map in (("config.json", config_map), ("tokenizer_config.json", tokenizer_map)):
        if auto_map:
            config = json.loads((path / name).read_text())
            (path / name).write_text(json.dumps({**config, "auto_map": auto_map}))
    (path / "modeling_evil.py").write_text(EVIL)
    (path / "tokenization_evil.py").write_text(EVIL)
    return path


@pytest.mark.parametrize("where", ["config", "tokenizer"])
def test_a_model_directory_with_an_auto_map_is_refused_and_its_code_never_runs(tmp_path, where):
    hf = model_dir(tmp_path / "m", config_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
                   if where == "config" else None,
                   tokenizer_map={"AutoTokenizer": ["tokenization_evil.Slow", "tokenization_evil.Fast"]}
                   if where == "tokenizer" else None)
    file = "modeling_evil.py" if where == "config" else "tokenization_evil.py"
    for load in (lambda: hf_directory(f"hf:{hf}"), lambda: load_causal_lm(hf), lambda: load_tokenizer(hf)):
        with pytest.raises(ValueError, match=f"has an auto_map .*{file}.*never runs a model directory's code"):
            load()
    for command in (["check", "--model", f"hf:{hf}"],
                    ["train", "--task", "arithmetic", "--model", f"hf:{hf}", "--steps", "1", "--out",
                     str(tmp_path / "run")]):
        done = subprocess.run([sys.executable, "-m", "nesgpu", *command], capture_output=True, text=True,
                              input="y\n" * 8, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert "auto_map" in done.stderr and "trust_remote_code" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (hf / "ran").exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", "config.json"])
def test_a_model_directory_file_that_is_a_fifo_or_a_device_is_refused_not_read(tmp_path, name):
    hf = model_dir(tmp_path / "m")
    for target in ("fifo", "/dev/zero"):
        (hf / name).unlink()
        os.mkfifo(hf / name) if target == "fifo" else (hf / name).symlink_to(target)
        # read, a FIFO would block until a writer came (none will): the file is refused before it is opened
        with pytest.raises(ValueError, match=rf"{name}"):
            hf_directory(f"hf:{hf}")


def test_a_reward_module_leaves_the_import_path_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "rw.py").write_text("import helpers_of_rw\n\ndef ok(completions, **kw):\n"
                                    "    return [helpers_of_rw.ONE] * len(completions)\n")
    (tmp_path / "helpers_of_rw.py").write_text("ONE = 1.0\n")  # a helper: imported at the module's top level
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    assert code_file("rw") == (tmp_path / "rw.py").resolve()
    assert load_function("rw:ok")(["a"]) == [1.0]
    assert sys.path == before  # a tabulate.py here is not imported for the installed one torch imports at exit
    assert code_file("json") is None and code_file("sys") is None  # imported already: no new code


def test_a_chat_template_that_fails_is_one_error(tmp_path):
    tok = char_tokenizer()
    tok.chat_template = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(ValueError, match=r"chat template cannot render .*SecurityError"):
        render([{"role": "user", "content": "1+1="}], tok)


def test_prompts_files_that_cannot_be_read_are_named(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100000 + "]" * 100000 + "\n")
    with pytest.raises(ValueError, match="deep.jsonl, line 1: JSON nested too deeply"):
        read_jsonl(deep)
    with pytest.raises(ValueError, match="/dev/zero: not a regular file"):
        read_jsonl("/dev/zero")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"prompts \(.*empty.jsonl\): no rows"):
        prompt_rows(str(tmp_path / "empty.jsonl"))
    for column in ("completions", "prompts"):
        with pytest.raises(ValueError, match=f"row 0 has a column named '{column}'.*rename the column"):
            prompt_rows([{"prompt": "1+1=", column: "x"}])


def correct(completions, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def test_rewards_name_a_prompt_they_do_not_hold_and_load_functions_by_name(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="the rewards hold no row whose prompt renders as '9\\+9='"):
        Rewards(correct, {"1+1=": {"prompt": "1+1=", "answer": "2"}})(["9+9="], ["18"])
    (tmp_path / "rw.py").write_text("def ok(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    task = dataset_task([{"prompt": "1+1="}], char_tokenizer(), "rw:ok")
    assert task.reward(["1+1="], ["2"]).tolist() == [1.0]
    with pytest.raises(TypeError, match=r"callables or module:function names; got \['int'\]"):
        Rewards([3], {})


def test_held_out_rows_keep_their_own_columns_and_repeated_rows_are_kept():
    train = [{"prompt": "1+1=", "answer": "2"}] * 3 + [{"prompt": "2+2=", "answer": "4"}]
    held = [{"prompt": "1+1=", "answer": "11"}]  # the same prompt, another answer: the held-out row's
    task = dataset_task(train, char_tokenizer(), correct, eval_data=held, max_new_tokens=2)
    assert task.prompts == ["1+1="] * 3 + ["2+2="]
    assert task.reward(["1+1="], ["2"]).tolist() == [1.0]
    assert task.reward(["1+1="], ["2"], evaluating=True).tolist() == [0.0]
    assert task.reward(["1+1="], ["11"], evaluating=True).tolist() == [1.0]
    assert task.data_fingerprint() != dataset_task(train[:2], char_tokenizer(), correct,
                                                   eval_data=held).data_fingerprint()


def test_the_data_fingerprint_is_of_the_rows_as_given_and_the_same_in_every_process():
    code = ("import sys; sys.path.insert(0, 'tests'); from conftest import char_tokenizer\n"
            "from nesgpu.tasks.reward_data import dataset_task\n"
            "tok = char_tokenizer()\n"
            "tok.chat_template = '{{ strftime_now(\"%H:%M:%S.%f\") }}{{ messages[0].content }}'\n"
            "rows = [{'prompt': [{'role': 'user', 'content': '1+1='}], 'tags': {'b', 'a', 'c'}, 'meta': object()}]\n"
            "print(dataset_task(rows, tok, lambda completions, **kw: [0.0] * len(completions)).data_fingerprint())\n")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=str(seed))).stdout.strip() for seed in (1, 2, 3)}
    assert len(seen) == 1 and len(seen.pop()) == 16  # a template that prints the time, sets, object reprs


@pytest.mark.parametrize("value", [3e38, -3e38, float("inf"), float("nan")])
def test_rewards_the_statistics_cannot_hold_are_refused(value):
    task = GenerationTask(["1+1="], char_tokenizer(), lambda p, c: torch.full((len(c),), value),
                          max_new_tokens=2, correct_at=None)
    with pytest.raises(ValueError, match="rewards must be finite numbers of at most 1e\\+15 in magnitude"):
        task.evaluate(tiny_llama())


def test_eval_names_the_reward_file_it_imports_and_asks_before_one_from_elsewhere(tmp_path):
    from nesgpu.train import TrainConfig, train

    hf, code, away = model_dir(tmp_path / "m"), tmp_path / "code", tmp_path / "away"
    code.mkdir(), away.mkdir()
    (code / "rw.py").write_text("import pathlib\npathlib.Path(__file__).with_name('imported').touch()\n"
                                "def ok(completions, **kw):\n    return [1.0] * len(completions)\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "1+1="}) + "\n")
    train(TrainConfig.flat(task="generation", model=f"hf:{hf}", prompts=str(tmp_path / "p.jsonl"),
                      reward=f"{code / 'rw.py'}:ok", steps=1, population=2, batch_size=1, max_new_tokens=1,
                      sigma=0.01, lr=0.01, log="none", out=str(tmp_path / "run")), log=lambda *a, **k: None)
    (code / "imported").unlink()

    def evaluate(*flags):
        return subprocess.run([sys.executable, "-m", "nesgpu", "eval", str(tmp_path / "run"), *flags], cwd=away,
                              capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    refused = evaluate()
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert f"names the reward function {code / 'rw.py'}:ok, which imports {code / 'rw.py'}" in refused.stderr
    assert "--trust-run-code" in refused.stderr and not (code / "imported").exists()
    trusted = evaluate("--trust-reward-code")  # the old name of --trust-run-code
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert f"importing {code / 'rw.py'} for the reward function {code / 'rw.py'}:ok" in trusted.stderr
    assert json.loads(trusted.stdout)["metric"] == "mean_reward" and (code / "imported").exists()
    # a file the run ships, an installed module, a file in the working directory: each is named and refused
    (tmp_path / "run" / "evil.py").write_text(EVIL + "def ok(completions, **kw):\n    return [0.0]\n")
    (tmp_path / "rewards.py").write_text(EVIL + "def ok(completions, **kw):\n    return [0.0]\n")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    for reward, command in (("run/evil.py:ok", ["eval", "run"]), ("run/evil.py:ok", ["train", "--resume", "run"]),
                            ("this:s", ["eval", "run"]), ("rewards.py:ok", ["play", "run"])):
        (tmp_path / "run" / "config.json").write_text(json.dumps({**config, "reward": reward}))
        refused = subprocess.run([sys.executable, "-m", "nesgpu", *command], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr[-2000:]
        assert f"config.json names the reward function {reward}, which imports" in refused.stderr
        assert "--trust-run-code" in refused.stderr and "Beautiful is better" not in refused.stdout
        assert not (tmp_path / "run" / "ran").exists() and not (tmp_path / "ran").exists()


# a reward module that notes (a file named "rendering") when the chat template starts to render
RENDERING_NOTED = """import pathlib
from transformers import PreTrainedTokenizerBase
render = PreTrainedTokenizerBase.apply_chat_template
def noted(*args, **kwargs):
    pathlib.Path("rendering").touch()
    return render(*args, **kwargs)
PreTrainedTokenizerBase.apply_chat_template = noted
"""


def test_one_sigterm_stops_a_run_whose_chat_template_renders_forever(tmp_path):
    import signal
    import time

    hf = model_dir(tmp_path / "m")
    config = json.loads((hf / "tokenizer_config.json").read_text())
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    (hf / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": loops + "{{ messages }}"}))
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1="}]}) + "\n")
    (tmp_path / "rw.py").write_text(RENDERING_NOTED
                                    + "def ok(completions, **kw):\n    return [1.0] * len(completions)\n")
    run = subprocess.Popen([sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model", f"hf:{hf}",
                            "--prompts", "p.jsonl", "--reward", "rw:ok", "--steps", "1", "--out", "run"],
                           cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 240  # a guard against a hang, not a speed limit
        while not (tmp_path / "rendering").exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
        assert (tmp_path / "rendering").exists(), "the chat template never started to render"
        run.send_signal(signal.SIGTERM)  # once, as a scheduler or `timeout` sends it, while the template renders
        _, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 130 and "nesgpu train: interrupted" in err and "Traceback" not in err, err[-2000:]


def test_a_resume_on_a_prompts_file_changed_since_is_refused(tmp_path):
    from nesgpu.train import TrainConfig, train

    hf, prompts = model_dir(tmp_path / "m"), tmp_path / "p.jsonl"
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]
    prompts.write_text("\n".join(json.dumps(r) for r in rows))

    def run(steps, resume):
        cfg = TrainConfig.flat(task="generation", model=f"hf:{hf}", prompts=str(prompts), reward=f"{__name__}:correct",
                          steps=steps, population=2, batch_size=2, max_new_tokens=1, sigma=0.01, lr=0.01, log="none",
                          out=str(tmp_path / "run"))
        return train(cfg, resume=resume, log=lambda *a, **k: None)
    run(1, False)
    prompts.write_text("\n".join(json.dumps(r) for r in rows[:3]))
    with pytest.raises(ValueError, match=r"cannot resume .*the task's data .* differ from what the run trained on"):
        run(2, True)
    prompts.write_text("\n".join(json.dumps({**r, "answer": "0"}) for r in rows))  # the same prompts, other answers
    with pytest.raises(ValueError, match=r"the task's data .* differ"):
        run(2, True)
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    assert run(2, True)["steps"] == 2


def test_prompts_too_long_for_the_models_context_are_named_before_its_weights_load(tmp_path, monkeypatch):
    from nesgpu.tasks import reward_tasks

    hf = model_dir(tmp_path / "m")
    monkeypatch.setattr(reward_tasks, "load_causal_lm", lambda *a, **k: pytest.fail("the weights were loaded"))
    with pytest.raises(ValueError, match="prompts of 5 tokens and max_new_tokens 60 exceed the model's context of 64"):
        reward_tasks.PretrainedGenerationTask(hf, prompts=["1+1="], eval_prompts=["12+1="], max_new_tokens=60,
                                              reward=lambda p, c: torch.zeros(len(c)))


def test_the_prompts_file_and_reward_functions_are_checked_before_the_tokenizer_loads(tmp_path, monkeypatch):
    from nesgpu.tasks import TaskContext, dataset_tasks
    from nesgpu.train import TrainConfig

    hf = model_dir(tmp_path / "m")
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "1+1="}) + "\n")
    monkeypatch.setattr(dataset_tasks, "load_tokenizer", lambda *a: pytest.fail("the tokenizer was loaded"))
    for options, message in [({"prompts": str(tmp_path / "gone.jsonl")}, "cannot read the prompts file"),
                             ({"reward": f"{__name__}:nope"}, "has no function 'nope'"),
                             ({"reward_weights": "1,2"}, r"needs one weight per reward function \(1\); got 2")]:
        cfg = TrainConfig.from_dict({"task": "generation", "model": f"hf:{hf}", "prompts": str(tmp_path / "p.jsonl"),
                                     "reward": f"{__name__}:correct", **options}).resolved()
        with pytest.raises(ValueError, match=message):
            dataset_tasks.make_dataset_task("generation", TaskContext(model=cfg.model), cfg.task_options)
