"""--overwrite never costs the old run before the new one has made a step, and an allocation failure is one
line: a run that asked for more memory than the machine has leaves the old run as it was."""

import json

import pytest

from nesgpu.cli import main
from nesgpu.train import TrainConfig, train
from nesgpu.train.steps.evolution import EvolutionStep

RUN = dict(task="cartpole", population=8, steps=2, hidden=(4,))
CPU_MESSAGE = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
               "to allocate 256000000000 bytes. Error code 12 (Cannot allocate memory)")


def quiet(*args, **kwargs):
    pass


def files(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def failing_first_step(monkeypatch, error):
    def run(self):
        raise error
    monkeypatch.setattr(EvolutionStep, "run", run)


@pytest.mark.parametrize("error", [RuntimeError(CPU_MESSAGE), KeyboardInterrupt()])
def test_a_new_run_that_fails_before_its_first_step_gives_the_old_run_back(tmp_path, monkeypatch, error):
    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    before = files(out)
    failing_first_step(monkeypatch, error)
    with pytest.raises(type(error)):
        train(TrainConfig.flat(**{**RUN, "seed": 1}, out=str(out)), log=quiet, overwrite=True)
    assert files(out) == before  # the same files, byte for byte: nothing of the new run is left


def test_one_ctrl_c_during_the_new_runs_first_step_keeps_the_old_run(tmp_path, monkeypatch, capsys):
    import os
    import signal

    from nesgpu.train import Interrupted

    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    before = files(out)
    original = EvolutionStep.run

    def interrupted_first_step(self):
        if self.step == 0:
            os.kill(os.getpid(), signal.SIGINT)  # one Ctrl-C while the first step is under way
        return original(self)
    monkeypatch.setattr(EvolutionStep, "run", interrupted_first_step)
    with pytest.raises(Interrupted, match="the old run in .* is kept as it was"):
        train(TrainConfig.flat(**{**RUN, "seed": 1}, out=str(out)), log=quiet, overwrite=True)
    assert files(out) == before
    assert "stopping at the end of this step" in capsys.readouterr().err  # said at once, not after the step


def test_once_the_new_run_has_made_a_step_the_old_run_is_gone(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train(TrainConfig.flat(**{**RUN, "steps": 3}, out=str(out)), log=quiet)
    calls = []

    def fail_at_the_second_step(step, row):
        calls.append(step)
        if step == 2:
            raise RuntimeError("a failure after the first step")
    with pytest.raises(RuntimeError, match="after the first step"):
        train(TrainConfig.flat(**{**RUN, "seed": 1, "steps": 3}, out=str(out)), log=quiet, overwrite=True,
              callback=fail_at_the_second_step)
    assert calls == [1, 2] and json.loads((out / "config.json").read_text())["seed"] == 1
    assert not list(out.glob(".replaced-*"))
    train(TrainConfig.flat(**{**RUN, "seed": 2}, out=str(out)), log=quiet, overwrite=True)
    assert json.loads((out / "summary.json").read_text())["seed"] == 2 and not list(out.glob(".replaced-*"))


def test_an_old_run_left_aside_by_a_killed_overwrite_is_named_not_deleted(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    aside = out / ".replaced-4242"  # what a process killed (SIGKILL) during its first step leaves
    aside.mkdir()
    (aside / "summary.json").write_text("{}")
    with pytest.warns(UserWarning, match="replaced-4242 holds a run that an --overwrite moved aside"):
        train(TrainConfig.flat(**RUN, out=str(out)), log=quiet, overwrite=True)
    assert (aside / "summary.json").read_text() == "{}"


def test_eval_after_a_killed_overwrite_names_the_run_moved_aside(tmp_path):
    import os

    import nesgpu

    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    aside = out / ".replaced-4242"  # SIGKILL during the new run's first step: its config.json, no weights
    aside.mkdir()
    for name in os.listdir(out):
        if name not in (".replaced-4242", "config.json"):
            os.replace(out / name, aside / name)
    with pytest.raises(ValueError, match=r"holds no weights yet .*replaced-4242 holds the run an --overwrite moved "
                                         r"aside .*move its files back"):
        nesgpu.load_run(out)


def test_an_allocation_failure_is_one_line_and_keeps_the_old_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    args = ["train", "--task", "cartpole", "--steps", "2", "--population", "8", "--hidden", "4", "--out", str(out)]
    assert main(args) == 0
    before = files(out)
    failing_first_step(monkeypatch, RuntimeError(CPU_MESSAGE))
    with pytest.raises(SystemExit) as stop:
        main([*args, "--overwrite", "--seed", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "Traceback" not in err
    assert "nesgpu train: error: out of memory (tried to allocate 238.4 GiB); lower the sizes" in err
    assert "the old run in" in err and files(out) == before


def test_a_run_that_fails_before_writing_leaves_no_empty_directory(tmp_path, monkeypatch):
    failing_first_step(monkeypatch, RuntimeError(CPU_MESSAGE))
    with pytest.raises(RuntimeError):
        train(TrainConfig.flat(**RUN, out=str(tmp_path / "new")), log=quiet)
    assert (tmp_path / "new").is_dir()  # it had written its config.json and metrics.csv by then
    with pytest.raises(ValueError, match="unknown model"):
        train(TrainConfig.flat(**{**RUN, "model": "cnn"}, out=str(tmp_path / "never")), log=quiet)
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("error, said", [
    (RuntimeError(CPU_MESSAGE), "tried to allocate 238.4 GiB"),
    (MemoryError(), "MemoryError"),
    (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has"),
     "Tried to allocate 20.00 GiB"),
])
def test_every_allocator_failure_reads_the_same(tmp_path, monkeypatch, capsys, error, said):
    failing_first_step(monkeypatch, error)
    with pytest.raises(SystemExit) as stop:
        main(["train", "--task", "cartpole", "--steps", "2", "--population", "8", "--out", str(tmp_path / "r")])
    assert stop.value.code == 1 and f"out of memory ({said}); lower" in capsys.readouterr().err


def test_other_runtime_errors_keep_their_traceback(tmp_path, monkeypatch):
    failing_first_step(monkeypatch, RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["train", "--task", "cartpole", "--steps", "2", "--population", "8", "--out", str(tmp_path / "r")])
