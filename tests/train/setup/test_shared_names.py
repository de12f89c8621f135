"""A strategy and a task may declare options of the same name. Here a task of one's own declares
``weight_decay``, which openai_es and backprop declare too: given flat, the name goes to whichever chosen
component takes it; where both take it, it is given under its side (``strategy_options`` / ``task_options``,
flags ``--strategy-weight-decay`` / ``--task-weight-decay``), and config.json records it so."""

import json
from dataclasses import dataclass

import pytest

from nesgpu.cli import main
from nesgpu.options import check_options, option
from nesgpu.strategies import ARS, OpenAIES
from nesgpu.tasks import TASKS, TaskSpec, digits
from nesgpu.train import TrainConfig
from nesgpu.train.setup.component_options import STRATEGY, TASK, own_only, route, sides


@dataclass(frozen=True)
class SharedOptions:
    weight_decay: float = option(0.5, "the task's own weight decay (a name openai_es takes too)", at_least=0.0)

    def __post_init__(self):
        check_options(self, "shared")


def make(name, where, options):
    print(f"task weight_decay {options.weight_decay}")
    return digits(device=where.device, seed=where.seed, batch_size=16)


@pytest.fixture
def shared():
    TASKS.register("shared", TaskSpec(make, dict(population=8, sigma=0.1, lr=0.01, steps=2, hidden=(8,)),
                                      supervised=True, options=SharedOptions))
    yield
    del TASKS["shared"]


def test_a_flat_name_goes_to_the_chosen_component_that_takes_it(shared):
    assert sides("weight_decay") == [STRATEGY, TASK] and sides("top_b") == [STRATEGY]
    assert route("weight_decay", "ars", "shared") is TASK and route("weight_decay", "openai_es", "digits") is STRATEGY
    ars = TrainConfig.flat(task="shared", strategy="ars", weight_decay=0.25).resolved()
    assert ars.task_options == SharedOptions(weight_decay=0.25) and ars.strategy_options == ARS.Options()
    assert ars.option("weight_decay") == 0.25
    digits_run = TrainConfig.flat(task="digits", weight_decay=0.125).resolved()
    assert digits_run.strategy_options.weight_decay == 0.125
    with pytest.raises(ValueError, match=r"option 'weight_decay' is an option of strategy 'openai_es' and of task "
                                         r"'shared': give it under its side, in strategy_options or task_options"):
        TrainConfig.flat(task="shared", weight_decay=0.1)
    # an older run recorded every strategy's and task's option: the ones its own do not take are dropped
    assert own_only({"task": "digits", "strategy": "ars", "weight_decay": 0.0, "top_b": 2}, "ars", "digits") == {
        "task": "digits", "strategy": "ars", "top_b": 2}
    with pytest.raises(ValueError, match="applies to strategy openai_es or backprop or task shared, not to strategy "
                                         "'ars' nor task 'cartpole'"):
        TrainConfig.flat(task="cartpole", strategy="ars", weight_decay=0.1)
    with pytest.raises(TypeError, match=r"an option of a strategy and of a task: give it as "
                                        r"strategy_options=\{'weight_decay': \.\.\.\} or task_options="):
        TrainConfig(task="shared", weight_decay=0.1)


def test_both_sides_of_a_shared_name_are_kept_apart_through_files(shared, tmp_path):
    cfg = TrainConfig(task="shared", strategy_options={"weight_decay": 0.01}, task_options={"weight_decay": 0.3})
    resolved = cfg.resolved()
    assert resolved.strategy_options == OpenAIES.Options(weight_decay=0.01)
    assert resolved.task_options == SharedOptions(weight_decay=0.3)
    with pytest.raises(ValueError, match="is set for the strategy and for the task"):
        resolved.option("weight_decay")
    values = resolved.to_dict()
    assert values["strategy_options"] == {"weight_decay": 0.01} and values["task_options"] == {"weight_decay": 0.3}
    assert "weight_decay" not in values and values["shaping"] == "centered_ranks"  # the others stay flat
    assert TrainConfig.from_dict(json.loads(resolved.to_json())).resolved() == resolved
    (tmp_path / "c.yaml").write_text(resolved.to_yaml())
    assert TrainConfig.from_yaml(tmp_path / "c.yaml").resolved() == resolved
    changed = resolved.with_options(task_options={"weight_decay": 0.2})  # one side set, the other kept
    assert (changed.task_options.weight_decay, changed.strategy_options.weight_decay) == (0.2, 0.01)
    with pytest.raises(ValueError, match="shared: option 'weight_decay' must be >= 0"):
        TrainConfig(task="shared", task_options={"weight_decay": -1.0}).resolved()


def test_the_command_line_takes_each_side_by_its_prefix(shared, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--task", "shared", "--help"])
    helped = capsys.readouterr().out
    assert "--strategy-weight-decay X" in helped and "--task-weight-decay X" in helped
    assert "(default: 0.5)" in helped and "--weight-decay" not in helped
    with pytest.raises(SystemExit):
        main(["train", "--task", "shared", "--strategy", "ars", "--help"])
    assert "--weight-decay X" in capsys.readouterr().out  # ars takes none: the task's, unprefixed
    with pytest.raises(SystemExit) as refused:
        main(["train", "--task", "shared", "--weight-decay", "0.1"])
    assert refused.value.code == 2
    assert "give --strategy-weight-decay or --task-weight-decay" in capsys.readouterr().err
    run = tmp_path / "run"
    assert main(["train", "--task", "shared", "--strategy-weight-decay", "0.01", "--task-weight-decay", "0.3",
                 "--log", "none", "--out", str(run)]) == 0
    assert "task weight_decay 0.3" in capsys.readouterr().out
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["strategy_options"] == {"weight_decay": 0.01} and recorded["task_options"] == {"weight_decay": 0.3}
    assert main(["train", "--resume", str(run), "--steps", "3", "--task-weight-decay", "0.4"]) == 0
    assert "task weight_decay 0.4" in capsys.readouterr().out
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["strategy_options"] == {"weight_decay": 0.01} and recorded["task_options"] == {"weight_decay": 0.4}
