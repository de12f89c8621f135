"""Reward functions as users write them (issue 55): ``async def`` ones are awaited (TRL's GRPOTrainer takes them),
``exit(0)`` / ``sys.exit()`` in one is an error naming it (SystemExit ended nesgpu with status 0 mid-run), and a
working directory one changes is restored after each call, with one warning."""

import asyncio
import os
import sys

import pytest
from test_generation import PROMPTS, population, task

from nesgpu.tasks.generation_checks import RewardError
from nesgpu.tasks.reward_data import Rewards

pytest.importorskip("transformers")


def rewards(*functions):
    return Rewards(list(functions), {p: {"prompt": p, "answer": "2"} for p in PROMPTS})


async def waits(completions, answer, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def counts(completions, answer, **kwargs):
    return [float(len(c)) for c in completions]


def quits(completions, **kwargs):
    exit(0)


def exits(prompts, completions):
    sys.exit(3)


def test_an_async_reward_function_is_awaited_as_trl_does():
    awaited = population().evaluate(task(reward=rewards(waits)), 1, 0.5).fitness
    assert awaited.equal(population().evaluate(task(reward=rewards(counts)), 1, 0.5).fitness)


def test_an_async_reward_function_is_awaited_inside_a_running_event_loop_too():
    async def plain(prompts, completions):
        import torch
        return torch.ones(len(completions))

    async def in_a_loop():  # as in Jupyter, where an event loop runs the cell
        return population().evaluate(task(reward=plain), 1, 0.5).fitness
    assert asyncio.run(in_a_loop()).eq(1).all()


@pytest.mark.parametrize("reward, name, code", [(lambda: rewards(quits), "quits", 0), (lambda: exits, "exits", 3)])
def test_exit_in_a_reward_function_is_an_error_naming_it(reward, name, code):
    with pytest.raises(RewardError) as caught:
        population().evaluate(task(reward=reward()), 1, 0.5)
    line = globals()[name].__code__.co_firstlineno + 1
    assert str(caught.value) == f"the reward function {__name__}:{name} raised SystemExit: {code} (at {__file__}, " \
                                f"line {line})"


def test_a_reward_function_that_changes_the_working_directory_has_it_restored_with_one_warning(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()

    def moves(completions, **kwargs):
        os.chdir(tmp_path / "elsewhere")
        return [1.0] * len(completions)

    with pytest.warns(UserWarning, match=f"reward function {__name__}:.*moves changed the working directory") as seen:
        t = task(reward=rewards(moves))
        population().evaluate(t, 1, 0.5)
        population().evaluate(t, 2, 0.5)
    assert os.getcwd() == str(tmp_path)
    assert len([w for w in seen if "working directory" in str(w.message)]) == 1
