"""Strategies own their options: each strategy's Options become options of TrainConfig, config files and the
CLI; a value is checked once, by the Options; an option of another strategy is an error; and a new strategy
with an option of its own is one file plus one registration (docs/architecture.md's worked example, run here
through the CLI, a checkpoint and a resume)."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nesgpu.options import NoOptions, check_options, option
from nesgpu.strategies import ARS, PGPE, STRATEGIES, OpenAIES
from nesgpu.tasks.rl_options import RLOptions
from nesgpu.train import TrainConfig
from nesgpu.train.setup.component_options import STRATEGY, TASK, sides

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_every_component_option_is_taken_by_name_and_held_by_its_own_side():
    for owners in (STRATEGY, TASK):
        for name, options in owners.registry.items():
            for f in dataclasses.fields(options):
                assert sides(f.name) == [owners], f.name
    assert STRATEGY.owners("shaping") == ["openai_es", "pgpe"] and STRATEGY.owners("top_b") == ["ars"]
    assert STRATEGY.owners("optimizer") == ["backprop"] and TASK.owners("vector_mode") == ["gym"]
    cfg = TrainConfig.flat(task="pendulum", strategy="ars", top_b=2, episodes=3)
    assert cfg.strategy_options == {"top_b": 2} and cfg.task_options == {"episodes": 3}
    resolved = cfg.resolved()
    assert resolved.strategy_options == ARS.Options(top_b=2) and resolved.task_options.episodes == 3
    # read by name; not ars's: None
    assert (resolved.option("top_b"), resolved.option("episodes"), resolved.option("shaping")) == (2, 3, None)
    with pytest.raises(ValueError, match="unknown option 'top_c'"):
        resolved.option("top_c")
    with pytest.raises(TypeError, match=r"got 'episodes', an option of a task: give it as task_options=\{'episodes': "
                                        r"\.\.\.\}, or by name through TrainConfig.flat"):
        TrainConfig(task="pendulum", episodes=3)  # a component's options are its own
    changed = resolved.with_options(episodes=4)  # set by name: into the task's Options (checked), resolved the same
    assert changed.task_options == RLOptions(episodes=4, policy_output="tanh", observation_clip=0.0)
    assert changed.resolved().task_options.episodes == 4
    changed = resolved.with_options(top_b=1)  # a resolved config changed stays usable as it is
    changed.validate()
    assert changed.strategy_options == ARS.Options(top_b=1)
    with pytest.raises(ValueError, match="RL task: option 'episodes' must be >= 1"):
        resolved.with_options(episodes=0)
    assert TrainConfig.flat(task="cartpole", episodes=None) == TrainConfig(task="cartpole")  # None: unset
    for given, message in [(dict(task_options={"episode": 3}), r"\['episode'\] are not options of a task"),
                           (dict(task_options={"steps": 5}), r"\['steps'\] are not options of a task"),
                           (dict(strategy_options={"episodes": 5}), "are not options of a strategy")]:
        with pytest.raises(TypeError, match=message):
            TrainConfig(task="cartpole", **given)
    with pytest.raises(TypeError, match="TrainConfig got an unknown option 'top_k'"):
        TrainConfig.flat(top_k=2)
    with pytest.raises(AttributeError, match="no attribute 'top_k'"):
        TrainConfig().top_k  # noqa: B018


def test_a_resolved_config_holds_its_strategys_options_and_none_of_the_others():
    ars = TrainConfig.flat(task="pendulum", strategy="ars", top_b=2).resolved()
    assert (ars.option("top_b"), ars.option("ars_version"), ars.option("shaping"), ars.option("weight_decay"), ars.option("optimizer")) == (2, "v2", None, None, None)
    pgpe = TrainConfig.flat(task="pendulum", strategy="pgpe", sigma_lr=0.0).resolved()
    assert (pgpe.option("sigma_lr"), pgpe.option("max_sigma_change"), pgpe.option("shaping"), pgpe.option("top_b")) == (0.0, 0.2, "centered_ranks", None)
    # the task's tuned values hold for its own strategy only (digits tunes openai_es's weight decay)
    assert TrainConfig().resolved().option("weight_decay") == 0.005
    assert TrainConfig(strategy="backprop").resolved().option("weight_decay") == 0.01


@pytest.mark.parametrize("options, message", [
    (dict(strategy="ars", top_b=0), "ars: option 'top_b' must be >= 1; got 0"),
    (dict(strategy="ars", top_b=10_000), r"top_b must be in \[1, 32\]"),
    (dict(strategy="ars", ars_version="v3"), r"ars_version'? must be one of \['v1', 'v2'\]"),
    (dict(strategy="pgpe", max_sigma_change=1.5), "pgpe: option 'max_sigma_change' must be below 1"),
    (dict(strategy="pgpe", max_speed=-1.0), "pgpe: option 'max_speed' must be > 0"),
    (dict(weight_decay=float("nan")), "openai_es: option 'weight_decay' must be finite"),
    (dict(shaping="ranks"), "shaping'? must be one of"),
    (dict(top_b=4), r"option 'top_b' \(= 4\) applies to strategy 'ars', not to strategy 'openai_es'"),
    (dict(strategy="ars", shaping="z_score"), "applies to strategy 'openai_es' or 'pgpe', not to strategy 'ars'"),
    (dict(strategy="backprop", sigma_lr=0.5), "applies to strategy 'pgpe', not to strategy 'backprop'"),
])
def test_bad_strategy_options_are_refused_naming_strategy_option_and_value(options, message):
    with pytest.raises(ValueError, match=message):
        backprop = options.get("strategy") == "backprop"
        TrainConfig.flat(task="digits" if backprop else "pendulum", population=None if backprop else 64,
                         **options).resolved()


def test_an_older_run_directorys_config_of_every_strategys_options_still_loads():
    # config.json of an ars run written before the options moved: openai_es's and backprop's at their values
    old = dict(task="pendulum", strategy="ars", shaping="centered_ranks", weight_decay=0.0, top_b=None,
               ars_version="v1", optimizer="adamw", accumulate=1, activation_checkpointing=False, shard=False)
    cfg = TrainConfig.from_dict(old).resolved()
    assert (cfg.option("ars_version"), cfg.option("shaping"), cfg.option("optimizer"), cfg.option("shard")) == ("v1", None, None, None)


def test_the_strategies_build_their_options_and_check_them_once():
    assert ARS(8, top_b=2).options == ARS.Options(top_b=2, ars_version="v2")
    assert OpenAIES(4, shaping="raw").options.shaping == "raw"
    with pytest.raises(ValueError, match="openai_es: option 'weight_decay' must be >= 0"):
        OpenAIES(4, weight_decay=-1.0)
    with pytest.raises(ValueError, match="top_b must be in"):
        ARS(4, top_b=5)
    with pytest.raises(ValueError, match="pgpe: option 'sigma_lr' must be >= 0"):
        PGPE(4, num_perturbed=10, sigma_lr=-0.1)
    assert all(dataclasses.is_dataclass(cls.Options) for cls in STRATEGIES.values())


def test_options_check_types_choices_and_bounds():
    @dataclasses.dataclass(frozen=True)
    class Toy:
        n: int = option(1, "a count", at_least=1)
        kind: str = option("a", "a kind", choices=("a", "b"))

        def __post_init__(self):
            check_options(self, "toy")

    with pytest.raises(ValueError, match="toy: option 'n' must be int; got '2'"):
        Toy(n="2")
    with pytest.raises(ValueError, match="toy: option 'n' must be >= 1; got 0"):
        Toy(n=0)
    with pytest.raises(ValueError, match="toy: option 'kind' must be one of"):
        Toy(kind="c")
    assert dataclasses.fields(NoOptions()) == ()


DRIVER = """
import sys
sys.path.insert(0, {here!r})
import nesgpu.strategies
from baseline_strategy import BaselineES
nesgpu.strategies.STRATEGIES.register("baseline_es", BaselineES)  # the registration
from nesgpu.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_new_strategy_with_an_option_is_one_file_plus_one_registry_line(tmp_path):
    section = DOC.read_text().split("### A strategy with options and a state of its own")[1]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    (tmp_path / "baseline_strategy.py").write_text(code)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(here=str(tmp_path)))

    def nesgpu(*args):
        return subprocess.run([sys.executable, str(driver), "train", *args], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)

    run = tmp_path / "run"
    small = ["--task", "digits", "--population", "8", "--hidden", "8", "--checkpoint-every", "1"]
    done = nesgpu(*small, "--strategy", "baseline_es", "--baseline-decay", "0.5", "--steps", "2", "--out", str(run))
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "config.json").read_text())["baseline_decay"] == 0.5
    resumed = nesgpu("--resume", str(run), "--steps", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    helped = nesgpu("--strategy", "baseline_es", "--help")
    assert "--baseline-decay" in helped.stdout and "decay of the running fitness" in helped.stdout
    assert "--baseline-decay" not in nesgpu("--help").stdout  # another strategy's
    bad = nesgpu(*small, "--strategy", "baseline_es", "--baseline-decay", "1.5", "--print-config")
    assert bad.returncode != 0 and "baseline_decay' must be below 1; got 1.5" in bad.stderr
    assert "Traceback" not in bad.stderr
    other = nesgpu(*small, "--strategy", "ars", "--baseline-decay", "0.5", "--print-config")
    assert other.returncode != 0 and "applies to strategy 'baseline_es', not to strategy 'ars'" in other.stderr


def test_a_resolved_config_holds_its_tasks_options_and_none_of_the_others():
    digits = TrainConfig().resolved()
    assert (digits.option("batch_size"), digits.option("episodes"), digits.option("reward_shift"), digits.option("vector_mode")) == (128, None, None, None)
    pendulum = TrainConfig(task="pendulum").resolved()
    assert (pendulum.option("batch_size"), pendulum.option("episodes"), pendulum.option("eval_episodes"), pendulum.option("policy_output")) == (
        None, 2, 10, "tanh")
    gym = TrainConfig.flat(task="gym:Pendulum-v1", vector_mode="async").resolved()
    assert (gym.option("vector_mode"), gym.option("episodes")) == ("async", 1)


@pytest.mark.parametrize("options, message", [
    (dict(task="pendulum", episodes=0), "RL task: option 'episodes' must be >= 1; got 0"),
    (dict(task="pendulum", reward_shift=float("inf")), "RL task: option 'reward_shift' must be finite"),
    (dict(task="digits", batch_size=2**41), "option 'batch_size' must be <= "),
    (dict(task="digits", episodes=3), r"'episodes' \(= 3\) applies to task 'cartpole' or .*, not to task 'digits'"),
    (dict(task="pendulum", vector_mode="async"), "applies to task 'gym:<id>', not to task 'pendulum'"),
    (dict(task="pendulum", batch_size=32), "applies to task 'digits' or .*, not to task 'pendulum'"),
])
def test_bad_task_options_are_refused_naming_option_value_and_owners(options, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.flat(**options).resolved()


def test_an_older_run_directorys_config_of_every_tasks_options_still_loads():
    # a digits run's config.json from before the options moved: every RL option at the value it recorded
    old = dict(task="digits", batch_size=128, episodes=1, eval_episodes=10, vector_mode="sync", reward_shift=0.0,
               start_states="shared", policy_output="auto", observation_clip=5.0)
    cfg = TrainConfig.from_dict(old).resolved()
    assert (cfg.option("batch_size"), cfg.option("episodes"), cfg.option("policy_output"), cfg.option("observation_clip")) == (128, None, None, None)


@pytest.mark.parametrize("argv, message", [
    (["--task", "digits", "--episodes", "1"], "'episodes' (= 1) applies to task 'cartpole' or"),
    (["--task", "pendulum", "--batch-size", "64"], "'batch_size' (= 64) applies to task 'digits' or"),
    (["--task", "cartpole", "--vector-mode", "sync"], "'vector_mode' (= 'sync') applies to task 'gym:<id>'"),
])
def test_the_cli_refuses_another_tasks_options_even_at_their_defaults(argv, message, capsys):
    from nesgpu.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", *argv, "--print-config"])
    assert stop.value.code != 0 and message in capsys.readouterr().err
