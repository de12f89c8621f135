"""Whether a run's rollouts compile (--compile auto): a resumed run keeps its start's decision, a short time
budget decides against compiling, and compiling is said on the console and left out of the ETA."""

import io
import types

import pytest
import torch

from nesgpu.train import TrainConfig, train
from nesgpu.train.setup import defaults
from nesgpu.train.setup.defaults import budget_note, compiles, kept_compile
from nesgpu.train.steps.evolution import EvolutionStep
from nesgpu.train.storage.metrics import MetricsLog

# 4 members, one episode of pendulum's 200 steps: 800 environment steps a step
PENDULUM = dict(task="pendulum", population=4, hidden=(4,), episodes=1, strategy="openai_es", log="none")
LARGE = 3000  # auto compiles from here (in these tests): 2 steps (1600) run eagerly, 4 (3200) would compile


def quiet(*args, **kwargs):
    pass


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(defaults, "COMPILE_MIN_ENV_STEPS", LARGE)


def fitness(out):
    return [row["fitness_mean"] for row in MetricsLog.read(out / "metrics.csv")[1:]]


@pytest.mark.parametrize("recorded", [True, False])
def test_a_resumed_run_keeps_its_starts_compile_decision_and_says_so(tmp_path, small_threshold, recorded):
    out = tmp_path / "run"
    train(TrainConfig.flat(**PENDULUM, steps=2, out=str(out)), log=quiet)
    state_file = out / "checkpoint" / "state.pt"
    state = torch.load(state_file, weights_only=True)
    assert state["compiled"] is False
    if not recorded:  # a checkpoint of an older nesgpu: decided from its own --steps, and said
        del state["compiled"]
        buffer = io.BytesIO()
        torch.save(state, buffer)
        state_file.write_bytes(buffer.getvalue())
    lines = []
    resumed = train(TrainConfig.flat(**PENDULUM, steps=4, out=str(out)), resume=True, log=lines.append)
    said = [line for line in lines if "rollouts" in line and "--compile on|off" in line]
    assert len(said) == 1 and "eagerly" in said[0]
    assert ("does not record" in said[0]) != recorded
    assert ("--steps 4 alone would run them compiled" in said[0]) == recorded
    assert not any("compiling (torch.compile)" in line for line in lines)
    assert torch.load(state_file, weights_only=True)["compiled"] is False  # recorded again, for the next resume
    # bit for bit the uninterrupted run that runs eagerly (same machine, same process, same blocks)
    whole = train(TrainConfig.flat(**PENDULUM, steps=4, compile="off", out=str(tmp_path / "whole")), log=quiet)
    assert fitness(out) == fitness(tmp_path / "whole") and resumed["value"] == whole["value"]


def test_the_kept_decision_under_each_option():
    cfg = TrainConfig.flat(**PENDULUM, steps=2).resolved()
    assert not compiles(cfg)
    kept, note = kept_compile(cfg, True, {"steps": 600})  # started large: stays compiled at any --steps
    assert kept and "ran compiled from the run's start" in note and "alone would run them eagerly" in note
    assert kept_compile(cfg, False, {"steps": 2}) == (False, None)  # the same decision: nothing to say
    kept, note = kept_compile(cfg, None, {"steps": 10**9})  # no record: its own config's --steps decides
    assert kept and "does not record" in note and "--steps 1000000000" in note
    assert kept_compile(cfg, None, {"steps": "x"}) == (False, None)  # resume refuses that checkpoint itself
    off = TrainConfig.flat(**PENDULUM, steps=2, compile="off").resolved()
    assert kept_compile(off, True, {"steps": 600}) == (False, None)  # --compile on|off decides as it says


def test_a_short_time_budget_decides_against_compiling():
    # issue 55: this run compiled for 77 s of its 40 s budget and made one step (eagerly: 132)
    options = dict(task="pendulum", strategy="snes", layer="gaussian")
    assert compiles(TrainConfig.flat(**options).resolved())  # 300 steps by default: auto compiles
    short = TrainConfig.flat(**options, time_budget=40).resolved()
    assert not compiles(short) and "--time-budget 40 s decides against compiling" in budget_note(short, False)
    long = TrainConfig.flat(**options, time_budget=defaults.COMPILE_MIN_BUDGET).resolved()
    assert compiles(long) and "compiling counts inside --time-budget 300 s" in budget_note(long, True)
    assert budget_note(TrainConfig.flat(**PENDULUM, steps=2, time_budget=40).resolved(), False) is None  # none to compile
    assert budget_note(TrainConfig.flat(**options).resolved(), True) is None  # no budget


def test_a_budgeted_run_says_in_one_line_that_it_does_not_compile(tmp_path, small_threshold):
    lines = []
    summary = train(TrainConfig.flat(**PENDULUM, steps=4, time_budget=40, out=str(tmp_path / "run")), log=lines.append)
    assert len([line for line in lines if "decides against compiling" in line]) == 1
    assert not any("compiling (torch.compile)" in line for line in lines) and summary["steps"] == 4


def test_compiling_is_said_and_left_out_of_the_eta(tmp_path, monkeypatch):
    import nesgpu.train.trainer as trainer

    clock = [0.0]  # a fake clock: the first step takes 77 s (it compiles), each later one 1 s
    original = EvolutionStep.run

    def timed(self):
        result = original(self)
        clock[0] += 77.0 if self.step == 1 else 1.0
        return result

    monkeypatch.setattr(EvolutionStep, "run", timed)
    monkeypatch.setattr("nesgpu.train.loop.time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(trainer, "compiles", lambda cfg: True)  # as a compiled run: nothing compiles here
    lines = []
    train(TrainConfig.flat(task="digits", population=8, hidden=(8,), batch_size=8, steps=6, progress_every=1e-9,
                      log="none", out=str(tmp_path / "run")), log=lines.append)
    assert sum("compiling (torch.compile) in the first step" in line for line in lines) == 1
    steps = {int(line.split()[1].split("/")[0]): line for line in lines if line.startswith("step ")}
    assert steps[1].startswith("step 1/6  77 s  compiled, no ETA yet")
    assert steps[2].startswith("step 2/6  78 s  ETA 4 s ")  # 1 s a step after compiling, not (77 + 1) / 2
    assert " ETA 0 s " in steps[6]
