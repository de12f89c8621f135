"""How a run ends, and what resuming an ended run does: one rule for every stop reason (steps, time budget,
target, callback), and divergence advice that can work."""

import json

import pytest

from nesgpu.train import TrainConfig, train

RUN = dict(task="digits", population=8, hidden=(8,), eval_every=2, checkpoint_every=2)


def quiet(*args, **kwargs):
    pass


def files(out):
    return {name: (out / name).read_bytes() for name in ("metrics.csv", "model.safetensors", "summary.json")}


def rows(out):
    return (out / "metrics.csv").read_text().splitlines()[1:]


@pytest.mark.parametrize("ended, again, further", [
    (dict(steps=4), dict(steps=4), dict(steps=6)),
    (dict(steps=10_000, time_budget=0.3), dict(steps=10_000, time_budget=0.3), dict(steps=10_000, time_budget=0.6)),
    (dict(steps=200, target=0.2), dict(steps=200, target=0.2), dict(steps=200, target=0.99)),
])
def test_a_resumed_run_that_still_meets_its_stop_condition_takes_no_step(tmp_path, ended, again, further):
    out = tmp_path / "run"
    first = train(TrainConfig.flat(**RUN, **ended, out=str(out)), log=quiet)
    before, lines = files(out), []
    summary = train(TrainConfig.flat(**RUN, **again, out=str(out)), resume=True, log=lines.append)
    assert files(out)["metrics.csv"] == before["metrics.csv"]  # no step, no row
    assert summary["steps"] == first["steps"] and summary["stopped"] == first["stopped"]
    assert summary["value"] == first["value"]
    assert any(f"the run ended at step {first['steps']}" in line and "no step is taken (raise --" in line
               for line in lines)
    more = train(TrainConfig.flat(**RUN, **further, out=str(out)), resume=True, log=quiet)
    assert more["steps"] > first["steps"] and len(rows(out)) == 1 + more["steps"]  # step 0 too


def test_a_run_its_callback_stopped_goes_on_when_resumed(tmp_path):
    out = tmp_path / "run"
    first = train(TrainConfig.flat(**RUN, steps=10, out=str(out)), log=quiet, callback=lambda step, row: step == 3)
    assert first["stopped"] == "callback" and first["steps"] == 3
    assert json.loads((out / "summary.json").read_text())["stopped"] == "callback"
    more = train(TrainConfig.flat(**RUN, steps=10, out=str(out)), resume=True, log=quiet)
    assert more["steps"] == 10 and more["stopped"] == "steps"


@pytest.mark.parametrize("strategy, sizes", [("openai_es", "--lr or --sigma"), ("backprop", "--lr")])
def test_a_checkpoint_already_out_of_scale_is_not_offered_for_resuming(tmp_path, strategy, sizes):
    options = dict(task="digits", hidden=(8,), steps=6, lr=1e30, checkpoint_every=1, strategy=strategy)
    if strategy != "backprop":
        options["population"] = 8
    with pytest.raises(ValueError) as info:
        train(TrainConfig.flat(**options, out=str(tmp_path / "run")), log=quiet)
    message = str(info.value)
    assert "its weights already reach" in message and f"start a new run with a smaller {sizes}" in message
    assert strategy != "backprop" or "sigma" not in message
