"""The arithmetic and countdown verifiers: valid, invalid and malformed answers, and text that tries to run
code (it is parsed, never evaluated)."""

import pytest
import torch

from nesgpu.tasks.verifiers import (
    CORRECT,
    WELL_FORMED,
    arithmetic_problems,
    arithmetic_reward,
    countdown_problems,
    countdown_reward,
    parse,
    rewards_of,
)


@pytest.mark.parametrize("completion, reward", [("82", CORRECT), ("82\nmore", CORRECT), (" 82 ", CORRECT),
                                                ("81", WELL_FORMED), ("-3", WELL_FORMED), ("eighty", 0.0), ("", 0.0),
                                                ("8 2", 0.0), ("82.0", 0.0), ("--1", 0.0), ("-", 0.0),
                                                ("8" * 40, 0.0), ("٨٢", 0.0)])
def test_arithmetic(completion, reward):
    assert arithmetic_reward("37+45=", completion) == reward


@pytest.mark.parametrize("completion, reward", [
    ("7*3+12", CORRECT), ("12+3*7", CORRECT), ("(12-7)*3+18", WELL_FORMED),  # 18 is not given
    ("12*3-3", WELL_FORMED),  # 3 twice, 7 unused
    ("7*3", WELL_FORMED),  # 12 unused
    ("12/(7-7)", 0.0),  # a division by zero is no answer
    ("7*3+12=33", 0.0), ("7 * 3 + 12", CORRECT), ("-7+3*12", 0.0),  # unary minus is not an operation here
    ("__import__('os').system('touch /tmp/pwned')", 0.0), ("(lambda: 33)()", 0.0), ("7**3", 0.0),
    ("33.0", 0.0), ("[33]", 0.0), ("", 0.0), ("(" * 200, 0.0),
    ("7*3+12#comment", 0.0), ("0x7*3+12", 0.0), ("7*3+1_2", 0.0), ("7*3+\uff11\uff12", 0.0)])  # not arithmetic
def test_countdown(completion, reward):
    assert countdown_reward("3 7 12>33:", completion) == reward


def test_division_is_exact():
    assert countdown_reward("9 6 2>3:", "9/(6/2)") == CORRECT and countdown_reward("9 6 2>3:", "9/2*6") == WELL_FORMED
    assert parse("1/3+1/3+1/3")[0] == 1 and parse("1/0") is None


def test_code_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    for text in (f"open({str(marker)!r}, 'w')", f"__import__('pathlib').Path({str(marker)!r}).touch()"):
        assert countdown_reward("1 2>3:", text) == 0.0 and arithmetic_reward("1+2=", text) == 0.0
    assert not marker.exists()


def test_problems_are_a_function_of_the_seed_and_their_answers_verify():
    assert arithmetic_problems(5, seed=1) == arithmetic_problems(5, seed=1) != arithmetic_problems(5, seed=2)
    for prompt, answer in arithmetic_problems(50, seed=0):
        assert arithmetic_reward(prompt, answer) == CORRECT
    for prompt, answer in countdown_problems(50, seed=0):
        assert countdown_reward(prompt, answer) == CORRECT, (prompt, answer)


def test_bad_prompts_and_the_list_form():
    with pytest.raises(ValueError, match="not a countdown prompt"):
        countdown_reward("hello", "1+2")
    with pytest.raises(ValueError, match="not an arithmetic prompt"):
        arithmetic_reward("hello", "3")
    reward = rewards_of(countdown_reward)
    assert torch.equal(reward(["3 7 12>33:"] * 2, ["7*3+12", "7"]), torch.tensor([CORRECT, WELL_FORMED]))
