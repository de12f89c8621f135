"""``nesgpu train --task nosuch --help`` refuses the task in one line; ``--eval-generations`` has a stated bound."""

import pytest

from nesgpu.cli import main


@pytest.mark.parametrize("args", [["--task", "nosuch", "--help"], ["-h", "--task", "nosuch"], ["--task=gym", "-h"]])
def test_help_of_an_unknown_task_names_the_error_in_one_line(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *args])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nesgpu train: error: unknown task ")
    assert "expected one of" in lines[0]


@pytest.mark.parametrize("args", [["--task", "cartpole", "--help"], ["--help"], ["--task", "gym:Pendulum-v1", "-h"]])
def test_help_of_a_known_task_lists_its_options(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *args])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("usage: nesgpu train") and "-h, --help" in out


def test_eval_generations_is_bounded_with_the_limit_named(capsys):
    from nesgpu.tasks.generation_checks import MAX_EVAL_GENERATIONS, check_measures
    from nesgpu.tasks.reward_tasks import PromptOptions

    assert MAX_EVAL_GENERATIONS == 1024
    assert PromptOptions(eval_generations=1024).eval_generations == 1024
    with pytest.raises(ValueError, match="option 'eval_generations' must be <= 1024; got 100000000"):
        PromptOptions(eval_generations=10**8)
    with pytest.raises(ValueError, match="eval_generations must be an int >= 0 and <= 1024"):
        check_measures(False, 10**8, 1.0)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "arithmetic", "--model", "hf:nowhere", "--eval-generations", "100000000",
              "--print-config"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "'eval_generations' must be <= 1024" in err[0]
