"""A reward function that raises is named where it raised: ``module:name``, its file and the line of the
traceback in that file, in one line (issue 55: "the reward function raised TypeError: string indices must be
integers" named no function, file or line)."""

import json
import subprocess
import sys

import pytest
from conftest import char_tokenizer
from test_generation import population, task, tiny_llama

from nesgpu.tasks.generation_checks import reward_error
from nesgpu.tasks.reward_data import Rewards

pytest.importorskip("transformers")


def indexes_a_string(completions, answer, **kwargs):
    return [float(c == a["value"]) for c, a in zip(completions, answer)]  # answer is a str: TypeError


def divides(prompts, completions):
    return helper(len(completions))


def helper(n):
    return n / 0


def test_a_plain_reward_function_is_named_with_its_file_and_the_line_it_raised_at():
    with pytest.raises(ValueError) as caught:
        population().evaluate(task(reward=divides), 1, 0.5)
    message = str(caught.value)
    line = helper.__code__.co_firstlineno + 1
    assert message == (f"the reward function {__name__}:divides raised ZeroDivisionError: division by zero "
                       f"(at {__file__}, line {line})")


def test_a_trl_style_function_is_named_by_rewards_not_as_the_rewards_object():
    reward = Rewards([indexes_a_string], {"1+2=": {"prompt": "1+2=", "answer": "3"}})
    with pytest.raises(ValueError) as caught:
        population().evaluate(task(prompts=["1+2="], reward=reward, prompts_per_step=1), 1, 0.5)
    message = str(caught.value)
    assert message.startswith(f"the reward function {__name__}:indexes_a_string raised TypeError: string indices")
    assert message.endswith(f"(at {__file__}, line {indexes_a_string.__code__.co_firstlineno + 1})")
    assert "\n" not in message


def test_an_error_without_a_traceback_or_a_message_still_names_the_function():
    class Scorer:
        def __call__(self, prompts, completions):
            return []

    assert str(reward_error(Scorer(), KeyError())) == f"the reward function {__name__}:{Scorer.__qualname__} raised " \
                                                      f"KeyError"
    assert "raised ValueError: two lines" in str(reward_error(divides, ValueError("two\n  lines")))


def test_the_cli_prints_one_line_naming_the_function_its_file_and_line(tmp_path):
    model_dir = tmp_path / "lm"
    tiny_llama().save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "1+2=", "answer": "3"}))
    (tmp_path / "rewards.py").write_text(
        "def correct(completions, answer, **kwargs):\n"
        "    return [float(c == a['value']) for c, a in zip(completions, answer)]\n")
    done = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model",
                           f"hf:{model_dir}", "--prompts", "train.jsonl", "--reward", "rewards:correct", "--steps", "1",
                           "--population", "2", "--batch-size", "1", "--max-new-tokens", "2", "--out", "run",
                           "--log", "none"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "reward function" in line]
    assert len(lines) == 1, done.stderr
    assert "rewards:correct raised TypeError: string indices must be integers" in lines[0]
    assert f"{tmp_path / 'rewards.py'}, line 2)" in lines[0]
