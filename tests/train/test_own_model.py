"""Your own model and task get the whole trainer: run directory, checkpoints, bit-identical resume,
load_run, tune and compare."""

import dataclasses

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import nesgpu
from nesgpu.tasks import ClassificationTask
from nesgpu.train import TrainConfig, train
from nesgpu.train.storage.metrics import MetricsLog

quiet = lambda *a, **k: None  # noqa: E731


def toy_task(seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 6, generator=gen)
    y = (x[:, :2].sum(1) > 0).long() + (x[:, 2] > 0.5).long()
    return ClassificationTask(x[:240], y[:240], x[240:], y[240:], batch_size=16, name="toy", **kw)


def toy_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def config(tmp_path, name="run", **kw):
    values = dict(steps=6, population=16, sigma=0.1, lr=0.05, eval_every=3, checkpoint_every=3, log="none",
                  out=str(tmp_path / name))
    values.update(kw)
    return TrainConfig.flat(**values)


def test_own_model_and_task_get_a_run_directory(tmp_path):
    summary = train(config(tmp_path), model=toy_model(), task=toy_task(), log=quiet)
    out = tmp_path / "run"
    assert summary["task"] == "custom:toy" and summary["metric"] == "test_accuracy" and summary["steps"] == 6
    assert {"config.json", "metrics.csv", "model.safetensors", "summary.json", "checkpoint"} <= {
        p.name for p in out.iterdir()}
    assert [row["step"] for row in MetricsLog.read(out / "metrics.csv")] == list(range(0, 7))


@pytest.mark.parametrize("strategy", ["openai_es", "pgpe", "backprop"])
def test_resume_with_the_same_model_and_task_is_bit_identical(tmp_path, strategy):
    es = strategy != "backprop"  # population and sigma are ES options
    straight = config(tmp_path, "straight", strategy=strategy, population=16 if es else None, sigma=0.1 if es else None)
    train(straight, model=toy_model(), task=toy_task(), log=quiet)
    train(dataclasses.replace(straight, out=str(tmp_path / "split"), steps=3), model=toy_model(), task=toy_task(),
          log=quiet)
    train(dataclasses.replace(straight, out=str(tmp_path / "split")), model=toy_model(seed=5), task=toy_task(),
          resume=True, log=quiet)  # the weights come from the checkpoint
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "split" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [MetricsLog.read(tmp_path / d / "metrics.csv") for d in ("straight", "split")]
    drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
    assert [drop(r) for r in rows[0]] == [drop(r) for r in rows[1]]


def test_load_run_needs_the_model_and_task_again_and_gives_the_trained_weights(tmp_path):
    model = toy_model()
    summary = train(config(tmp_path), model=model, task=toy_task(), log=quiet)
    with pytest.raises(ValueError, match=r"trained a task of your own \(custom:toy\); pass it"):
        nesgpu.load_run(tmp_path / "run")
    loaded, task, cfg = nesgpu.load_run(tmp_path / "run", model=toy_model(seed=3), task=toy_task())
    assert cfg.task == "custom:toy" and task.evaluate(loaded) == pytest.approx(summary["value"])
    for p, q in zip(model.parameters(), loaded.parameters()):
        assert torch.equal(p, q)


def test_a_converted_model_keeps_its_kinds(tmp_path):
    net = nesgpu.convert(toy_model(), "gaussian")
    with pytest.warns(UserWarning, match=r"converted already \(kinds \['gaussian'\]\) and keeps its own options, so "
                                         r"these config values are ignored: layer 'lowrank'$"):
        train(config(tmp_path, layer="lowrank"), model=net, task=toy_task(), log=quiet)
    assert [m.kind.name for m in net.modules() if isinstance(m, nesgpu.PerturbedModule)] == ["gaussian"] * 2
    lowrank = nesgpu.convert(toy_model(), "lowrank")  # the config's very layer: only its options are named
    with pytest.warns(UserWarning, match=r"ignored: layer options \{'rank': 2\}$"):
        train(config(tmp_path, "same", layer="lowrank", layer_options={"rank": 2}), model=lowrank, task=toy_task(),
              log=quiet)


class Target:
    """A task of one's own, written from the protocol alone: the model's output on fixed inputs should match
    a target (fitness = minus the squared error); it declares its own defaults."""

    metric = "minus_error"
    default_target = None
    summed_info = frozenset()
    defaults = {"population": 8, "sigma": 0.2, "steps": 4}

    def __init__(self):
        self.x = torch.linspace(-1, 1, 12).view(12, 1)
        self.y = 0.5 * self.x

    def make_model(self, hidden, model):
        return nn.Linear(1, 1)

    def fitness(self, pm, step):
        rows = pm.member_rows(self.x)  # every member sees every input
        error = (pm(rows) - pm.member_rows(self.y)).pow(2).view(2, 12, pm.local_directions).mean(1)
        return -error, {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        with torch.no_grad():
            return -float((model(self.x) - self.y).pow(2).mean())


def test_a_protocol_task_with_its_own_defaults_and_model(tmp_path):
    summary = train(TrainConfig(out=str(tmp_path / "t"), log="none", eval_every=2), task=Target(), log=quiet)
    assert summary["task"] == "custom:Target" and summary["population"] == 8 and summary["steps"] == 4
    assert summary["sigma"] == 0.2
    rows = MetricsLog.read(tmp_path / "t" / "metrics.csv")  # the task's own metric has its column
    assert [r["step"] for r in rows if "minus_error" in r] == [0, 2, 4] and rows[-1]["minus_error"] == pytest.approx(
        summary["value"], rel=1e-5)


def test_what_is_not_a_task_or_a_model_is_refused(tmp_path):
    with pytest.raises(TypeError, match="a task needs"):
        train(config(tmp_path), task=object(), log=quiet)
    with pytest.raises(TypeError, match="model must be an nn.Module; got str"):
        train(config(tmp_path), model="net", task=toy_task(), log=quiet)
    with pytest.raises(TypeError, match="backprop needs a task with"):
        train(TrainConfig(strategy="backprop", out=str(tmp_path / "b"), log="none"), task=Target(), log=quiet)
    assert not (tmp_path / "run").exists() and not (tmp_path / "b").exists()


def test_compare_and_tune_take_your_model_and_task(tmp_path):
    from nesgpu.frontends.compare import compare

    model = toy_model()
    before = [p.clone() for p in model.parameters()]
    result = compare(toy_task(), budget=0.5, seeds=[0], out=tmp_path / "cmp", evals=2, model=model,
                     shared={"log": "none"}, es={"population": 16}, log=quiet)
    assert [r["strategy"] for r in result["runs"]] == ["openai_es", "backprop"]
    assert all(r["task"] == "custom:toy" for r in result["runs"])
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))  # each run trained a copy
    pytest.importorskip("optuna")
    from nesgpu.tune.study import tune

    study = tune(TrainConfig(steps=2, population=16, log="none"), {"lr": {"low": 0.01, "high": 0.1, "log": True}},
                 trials=2, out=tmp_path / "tune", model=model, task=toy_task(), plots=False, log=quiet)
    assert len([t for t in study.trials if t.value is not None]) == 2
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))


class Sequential2(nn.Sequential):
    """The same parameter names as toy_model's: only the class tells them apart."""


def test_another_model_class_or_task_name_is_refused_by_load_run_and_resume(tmp_path):
    train(config(tmp_path, steps=2), model=toy_model(), task=toy_task(), log=quiet)
    other = Sequential2(*toy_model())
    with pytest.raises(ValueError, match=r"saved from a torch.nn.modules.container.Sequential; got a .*Sequential2"):
        nesgpu.load_run(tmp_path / "run", model=other, task=toy_task())
    renamed = toy_task()
    renamed.name = "other"
    with pytest.raises(ValueError, match="trained task 'custom:toy'; got a task named 'custom:other'"):
        nesgpu.load_run(tmp_path / "run", model=toy_model(), task=renamed)
    with pytest.raises(ValueError, match="got a .*Sequential2"):
        train(config(tmp_path, steps=4), model=Sequential2(*toy_model()), task=toy_task(), resume=True, log=quiet)
    train(config(tmp_path, steps=4), model=toy_model(), task=toy_task(), resume=True, log=quiet)  # the same: fine


class Broken(Target):
    def __init__(self, fitness=None, value=None):
        super().__init__()
        self.bad_fitness, self.value = fitness, value

    def fitness(self, pm, step):
        good, info = super().fitness(pm, step)
        return (good if self.bad_fitness is None else self.bad_fitness(good)), info

    def evaluate(self, model):
        return super().evaluate(model) if self.value is None else self.value


@pytest.mark.parametrize("task, error, match", [
    (Broken(fitness=lambda f: f.tolist()), TypeError, r"Broken.fitness must return \(a real torch.Tensor of shape "
                                                      r"\(R, 4\), a dict\); got list"),
    (Broken(fitness=lambda f: f.flatten()), ValueError, r"fitness of shape \(R, 4\).*got shape \(8,\)"),
    (Broken(fitness=lambda f: f.T), ValueError, r"got shape \(4, 2\)"),
    (Broken(value="0.5"), TypeError, r"Broken.evaluate must return a number \(its 'minus_error'\); got str"),
])
def test_a_custom_task_that_breaks_the_protocol_is_named(tmp_path, task, error, match):
    with pytest.raises(error, match=match):
        train(TrainConfig(out=str(tmp_path / "t"), log="none"), task=task, log=quiet)


def test_a_model_with_nan_weights_is_refused_before_any_step(tmp_path):
    model = toy_model()
    with torch.no_grad():
        model[0].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"weights \['0.weight'\] hold NaN or infinity before the first step"):
        train(config(tmp_path), model=model, task=toy_task(), log=quiet)


def test_a_classification_task_of_your_own_makes_its_model(tmp_path):
    summary = train(config(tmp_path, hidden=(8,)), task=toy_task(), log=quiet)  # no model=: the task's MLP
    loaded, _, _ = nesgpu.load_run(tmp_path / "run", task=toy_task())
    assert summary["task"] == "custom:toy" and toy_task().evaluate(loaded) == pytest.approx(summary["value"])


def test_nesgpu_eval_takes_your_task_and_model_as_module_names(tmp_path, monkeypatch, capsys):
    import json

    from nesgpu.cli import main

    summary = train(config(tmp_path), model=toy_model(), task=toy_task(), log=quiet)
    here = str(__import__("pathlib").Path(__file__).parent)
    (tmp_path / "mine.py").write_text(f"import sys\nsys.path.insert(0, {here!r})\nfrom test_own_model import "
                                      f"toy_task, toy_model\ntask = toy_task()\n")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "run", "--task", "mine:task", "--model", "mine:toy_model", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == pytest.approx(summary["value"])
    for args, message in [([], "or nesgpu eval run --task module:task"), (["--task", "mine:nope"], "mine has no task "
                          "'nope'"), (["--task", "mine:toy_model"], "--task mine:toy_model: expected a task")]:
        with pytest.raises(SystemExit) as stop:
            main(["eval", "run", *args])
        assert stop.value.code == 2 and message in capsys.readouterr().err
