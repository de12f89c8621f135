"""Run directories: nothing is overwritten by accident, two writers never share a run, a resumed run is
the run it claims to be, non-finite weights never reach a checkpoint, and Ctrl-C keeps the work."""

import csv
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys

import pytest
import torch

from nesgpu.cli import main
from nesgpu.strategies import Schedule
from nesgpu.tasks.rl import RLTask
from nesgpu.train import TrainConfig, train
from nesgpu.train.steps.evolution import EvolutionStep
from nesgpu.train.storage.checkpoint import find_checkpoint, write_json
from nesgpu.train.storage.metrics import MetricsLog
from nesgpu.train.trainer import Interrupted

RUN = dict(task="cartpole", population=16, steps=6, hidden=(4,), checkpoint_every=1)


def quiet(*args, **kwargs):
    pass


def run(tmp_path, **options):
    return train(TrainConfig.flat(**{**RUN, **options}, out=str(tmp_path / "run")), log=quiet,
                 **{k: options.pop(k) for k in list(options) if k in ("resume", "overwrite")})


def test_an_existing_run_is_refused_unless_resume_or_overwrite(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    before = (out / "summary.json").read_text()
    with pytest.raises(ValueError, match="already holds a run; pass --resume to continue it or --overwrite"):
        train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    assert (out / "summary.json").read_text() == before
    old_events = set((out / "tensorboard").iterdir())
    summary = train(TrainConfig.flat(**{**RUN, "seed": 1}, out=str(out)), log=quiet, overwrite=True)
    assert json.loads((out / "summary.json").read_text())["seed"] == 1 == summary["seed"]
    assert not old_events & set((out / "tensorboard").iterdir())  # the old run's curves are gone too
    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    with pytest.raises(ValueError, match="is not empty and holds no nesgpu run"):
        train(TrainConfig.flat(**RUN, out=str(other)), log=quiet, overwrite=True)
    assert (other / "thesis.tex").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; expected a directory"):
        train(TrainConfig.flat(**RUN, out=str(tmp_path / "file")), log=quiet)


def test_a_live_writer_locks_the_run_and_a_stale_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    host = socket.gethostname()
    (out / ".lock").write_text(f"{host}:{os.getppid()}")  # a live process
    with pytest.raises(ValueError, match=rf"being written by another process \({host}:{os.getppid()}\)"):
        train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    (out / ".lock").write_text(f"another-host:{os.getpid()}")  # cannot be checked from here: live
    with pytest.raises(ValueError, match="another-host"):
        train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    (out / ".lock").write_text(f"{host}:{finished.stdout.strip()}")  # its process is gone
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    assert not (out / ".lock").exists()
    (out / ".lock").write_text(f"{host}:{os.getpid()}")  # our own pid (a restarted container's pid 1): stale
    train(TrainConfig.flat(**{**RUN, "steps": 7}, out=str(out)), resume=True, log=quiet)


def test_leftover_temporary_files_are_removed_at_the_next_start(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    (out / ".checkpoint.tmp-killed").mkdir()
    (out / ".summary.json.tmp-killed").write_text("{")
    train(TrainConfig.flat(**{**RUN, "steps": 7}, out=str(out)), resume=True, log=quiet)
    assert not list(out.glob(".*.tmp-*"))


def test_resume_refuses_defining_changes_before_writing_and_applies_the_others(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig.flat(**{**RUN, "steps": 4}, out=str(out)), log=quiet)
    config = (out / "config.json").read_text()
    with pytest.raises(ValueError, match=r"define the run differ from its checkpoint \(population: 16 -> 32; seed: "
                                         r"0 -> 3\)"):
        train(TrainConfig.flat(**{**RUN, "population": 32, "seed": 3}, out=str(out)), resume=True, log=quiet)
    with pytest.raises(ValueError, match="--steps 3 is below the checkpoint's step 4"):
        train(TrainConfig.flat(**{**RUN, "steps": 3}, out=str(out)), resume=True, log=quiet)
    assert (out / "config.json").read_text() == config  # nothing was written
    lines = []
    train(TrainConfig.flat(**{**RUN, "steps": 6, "sigma": 0.2, "lr": 0.05}, out=str(out)), resume=True,
          log=lines.append)
    assert "from step 5: " in lines[0] and "sigma: 0.5 -> 0.2" in lines[0] and "lr: 0.15 -> 0.05" in lines[0]
    rows = (out / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    last = dict(zip(header, rows[-1].split(",")))
    # cartpole's PGPE adapts sigma a little each step: from the new 0.2, not from the old 0.5
    assert float(last["sigma"]) == pytest.approx(0.2, rel=0.05) and float(last["lr"]) == pytest.approx(0.05)


def test_per_parameter_sigmas_out_of_range_never_reach_a_checkpoint(tmp_path):
    # SNES at --scale-lr 1e9 takes its scales to float32's largest in one step: finite, and no resume takes them
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"step 1 made non-finite \(or out of range\) values in \[\"scales\['net"
                                         r"\.0\.weight'\] over 1e\+18\".*no checkpoint was written"):
        train(TrainConfig.flat(**{**RUN, "task": "pendulum", "strategy": "snes", "scale_lr": 1e9},
                          out=str(out)), log=quiet)
    assert find_checkpoint(out / "checkpoint") is None


def test_non_finite_weights_never_reach_a_checkpoint(tmp_path, monkeypatch):
    original = EvolutionStep.run

    def diverging(self):
        stats = original(self)
        if self.step == 3:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return stats

    monkeypatch.setattr(EvolutionStep, "run", diverging)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"step 3 made non-finite \(or out of range\) values in \['net.0.weight'.*"
                                         r"checkpoint of step 2 is kept; resume it with a smaller --lr or --sigma"):
        train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    state = torch.load(find_checkpoint(out / "checkpoint") / "state.pt", weights_only=True)
    assert state["strategy"]["step"] == 2
    monkeypatch.setattr(EvolutionStep, "run", original)
    train(TrainConfig.flat(**{**RUN, "lr": 0.05}, out=str(out)), resume=True, log=quiet)  # the run goes on


def _interrupt_at(monkeypatch, at_step):
    original = RLTask.fitness

    def fitness(self, pm, step):
        if step == at_step:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the step runs
        return original(self, pm, step)

    monkeypatch.setattr(RLTask, "fitness", fitness)
    return original


def test_ctrl_c_finishes_the_step_writes_a_checkpoint_and_resumes_identically(tmp_path, monkeypatch):
    full = train(TrainConfig.flat(**{**RUN, "checkpoint_every": 3}, out=str(tmp_path / "full")), log=quiet)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under `nohup ... &`
    original = _interrupt_at(monkeypatch, 2)
    out = tmp_path / "run"
    with pytest.raises(Interrupted, match=rf"checkpoint at step 2 in {out}; continue with --resume"):
        train(TrainConfig.flat(**{**RUN, "checkpoint_every": 3}, out=str(out)), log=quiet)
    monkeypatch.setattr(RLTask, "fitness", original)
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
    resumed = train(TrainConfig.flat(**{**RUN, "checkpoint_every": 3}, out=str(out)), resume=True, log=quiet)
    assert resumed["value"] == full["value"]
    from safetensors.torch import load_file
    a, b = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_from_the_cli_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    _interrupt_at(monkeypatch, 2)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "cartpole", "--population", "16", "--steps", "6", "--hidden", "4",
              "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nesgpu train: interrupted: checkpoint at step 2") and "Traceback" not in "\n".join(err)


def test_run_files_are_world_readable_and_summary_is_strict_json(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    for name in ("summary.json", "config.json", "model.safetensors", "checkpoint/model.safetensors"):
        assert stat.S_IMODE((out / name).stat().st_mode) & 0o044 == 0o044, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["versions"]["torch"] == torch.__version__
    write_json(tmp_path / "s.json", {"value": float("nan"), "rows": [float("inf"), 1.0]})
    assert json.loads((tmp_path / "s.json").read_text()) == {"value": None, "rows": [None, 1.0]}


def test_load_run_returns_the_trained_model_and_refuses_non_finite_weights(tmp_path):
    from safetensors.torch import load_file, save_file

    import nesgpu

    out = tmp_path / "run"
    summary = train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    model, task, config = nesgpu.load_run(out, device="cpu")
    assert config.task == "cartpole" and not model.training
    assert task.evaluate(model) == summary["value"]
    tensors = load_file(str(out / "model.safetensors"))
    name = next(iter(k for k in tensors if k.endswith("weight")))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"non-finite values in \['{name}'\]; the run diverged"):
        nesgpu.load_run(out, device="cpu")


@pytest.mark.parametrize("text,message", [
    ('antithetic: "no"\n', "option 'antithetic' must be bool or None; got 'no' \\(str\\)"),
    ("steps: 3.7\n", "option 'steps' must be int or None; got 3.7"),
    ("hidden: [8, true]\n", "option 'hidden' must be tuple"),
    ("sigma: fast\n", "option 'sigma' must be a number or 'auto'; got 'fast'"),
])
def test_yaml_values_are_type_checked_naming_the_field(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_yaml(path)


def test_eval_episodes_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="option 'eval_episodes' must be >= 1; got 0"):
        train(TrainConfig.flat(**{**RUN, "eval_episodes": 0}, out=str(tmp_path / "run")), log=quiet)


def test_a_run_stops_once_the_evaluated_metric_reaches_the_target(tmp_path):
    lines = []
    summary = train(TrainConfig.flat(**{**RUN, "steps": 40, "eval_every": 2, "target": 9.0}, out=str(tmp_path / "run")),
                    log=lines.append)
    assert summary["steps"] < 40 and summary["steps"] % 2 == 0 and summary["value"] >= 9.0
    assert any("reached the target 9 at step" in line for line in lines)
    state = torch.load(find_checkpoint(tmp_path / "run" / "checkpoint") / "state.pt", weights_only=True)
    assert state["strategy"]["step"] == summary["steps"]


def test_gym_tasks_default_to_the_environments_reward_threshold():
    pytest.importorskip("gymnasium")
    from nesgpu.tasks import make_task

    assert make_task("gym:CartPole-v1").default_target == 475.0
    assert make_task("cartpole").default_target is None  # the torch env sets none: run to --steps


def test_without_a_terminal_progress_is_a_plain_line_now_and_then(tmp_path):
    lines = []  # under pytest stderr is no terminal
    train(TrainConfig.flat(**{**RUN, "progress_every": 1e-9}, out=str(tmp_path / "run")), log=lines.append)
    steps = [line for line in lines if line.startswith("step ")]  # one before the first step, then each step's
    assert len(steps) == RUN["steps"] + 1 and steps[0].startswith("step 0/6") and "starting" in steps[0]
    assert steps[1].startswith("step 1/6") and "fitness_mean" in steps[1] and " ETA " in steps[1]
    assert steps[-1].startswith("step 6/6") and " ETA 0 s " in steps[-1]
    lines.clear()
    train(TrainConfig.flat(**{**RUN, "progress_every": 0.0}, out=str(tmp_path / "quiet")), log=lines.append)
    assert not [line for line in lines if line.startswith("step ")]


def test_a_full_disk_is_one_line_and_the_last_checkpoint_stays(tmp_path, monkeypatch, capsys):
    import errno

    import nesgpu.train.loop as trainer

    out = tmp_path / "run"
    original, calls = trainer.save_checkpoint, []

    def full_disk(directory, model, state):
        calls.append(state["strategy"]["step"])
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(directory))
        return original(directory, model, state)

    monkeypatch.setattr(trainer, "save_checkpoint", full_disk)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "cartpole", "--population", "16", "--steps", "6", "--hidden", "4",
              "--checkpoint-every", "1", "--out", str(out)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"nesgpu train: error: No space left on device ({out / 'checkpoint'}); checkpoints are "
                       f"written atomically, so the last one written (if any) is intact")
    state = torch.load(find_checkpoint(out / "checkpoint") / "state.pt", weights_only=True)
    assert state["strategy"]["step"] == 2
    assert not (out / ".lock").exists()


def test_an_unwritable_run_directory_is_one_line(tmp_path, capsys):
    # /proc takes no new directories, even from root (a chmod 0555 directory would not stop root)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "cartpole", "--steps", "1", "--out", "/proc/nesgpu-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nesgpu train: error: cannot create the run directory /proc/nesgpu-run")


def test_a_callback_sees_every_step_and_can_stop_the_run(tmp_path):
    seen = []

    def callback(step, row):
        seen.append((step, row.get("eval_return")))
        return step == 4

    summary = train(TrainConfig.flat(**{**RUN, "steps": 10, "eval_every": 2}, out=str(tmp_path / "run")), log=quiet,
                    callback=callback)
    assert [s for s, _ in seen] == [1, 2, 3, 4] and seen[1][1] is not None and seen[0][1] is None
    assert summary["steps"] == 4


def test_model_weights_carry_their_configuration(tmp_path):
    from safetensors import safe_open

    train(TrainConfig.flat(**RUN, out=str(tmp_path / "run")), log=quiet)
    with safe_open(str(tmp_path / "run" / "model.safetensors"), "pt") as f:
        metadata = f.metadata()
    assert json.loads(metadata["nesgpu_config"])["task"] == "cartpole" and metadata["nesgpu_version"]


def test_overwrite_keeps_the_old_run_when_the_new_one_cannot_be_built(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    with pytest.raises(ValueError, match="unknown model"):
        train(TrainConfig.flat(**{**RUN, "model": "cnn"}, out=str(out)), log=quiet, overwrite=True)
    assert (out / "summary.json").is_file() and find_checkpoint(out / "checkpoint") is not None


def test_a_folder_that_merely_looks_like_a_run_is_never_cleared(tmp_path):
    project = tmp_path / "project"
    (project / "checkpoint").mkdir(parents=True)
    (project / "checkpoint" / "epoch10.pt").write_text("weights")
    (project / "config.json").write_text('{"lr": 0.1}')
    (project / ".notes.tmp-keep").write_text("mine")
    with pytest.raises(ValueError, match="holds no nesgpu run"):
        train(TrainConfig.flat(**RUN, out=str(project)), log=quiet, overwrite=True)
    assert (project / "checkpoint" / "epoch10.pt").is_file() and (project / ".notes.tmp-keep").is_file()


def test_without_out_every_run_gets_a_new_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(TrainConfig.flat(**RUN), log=quiet)
    train(TrainConfig.flat(**RUN), log=quiet)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["cartpole", "cartpole-2"]


def test_a_resume_that_changes_the_evaluation_cadence_says_so(tmp_path):
    out, logs = tmp_path / "run", []
    train(TrainConfig.flat(**{**RUN, "steps": 10}, out=str(out)), log=quiet)  # eval_every 0: every step
    train(TrainConfig.flat(**{**RUN, "steps": 12}, out=str(out)), resume=True, log=logs.append)
    assert "evaluations every" not in logs[0]  # a tenth of 10 or of 12 steps: every step either way
    logs.clear()
    train(TrainConfig.flat(**{**RUN, "steps": 20}, out=str(out)), resume=True, log=logs.append)
    assert "evaluations every 2 steps, a tenth of --steps (were every 1: the rows that evaluate differ" in logs[0]


def test_resume_applies_a_new_schedule_or_a_stretched_one_from_the_next_step(tmp_path):
    out = tmp_path / "run"
    base = TrainConfig.flat(**RUN).resolved().lr
    train(TrainConfig.flat(**{**RUN, "lr_schedule": "cosine", "lr_final": 0.1}, out=str(out)), log=quiet)
    logs = []
    train(TrainConfig.flat(**{**RUN, "lr_schedule": "cosine", "lr_final": 0.1, "steps": 9}, out=str(out)), resume=True,
          log=logs.append)
    assert "steps: 6 -> 9" in logs[0] and "lr factor 0.1 -> " in logs[0]  # the schedule is stretched: it jumps
    rows = MetricsLog.read(out / "metrics.csv")
    stretched = Schedule("cosine", 0.1, 9)
    for row in rows[7:]:  # after step s, the optimizer holds the lr of step s + 1: base * factor(s)
        assert row["lr"] == pytest.approx(base * stretched(int(row["step"])), rel=1e-5)
    old = Schedule("cosine", 0.1, 6)
    for row in rows[1:7]:
        assert row["lr"] == pytest.approx(base * old(int(row["step"])), rel=1e-5)
    logs.clear()  # a constant lr from step 10 on, at half the step size
    train(TrainConfig.flat(**{**RUN, "lr": base / 2, "steps": 11}, out=str(out)), resume=True, log=logs.append)
    assert "lr_schedule: 'cosine' -> 'constant'" in logs[0]
    assert [r["lr"] for r in MetricsLog.read(out / "metrics.csv")[10:]] == pytest.approx([base / 2] * 2)


def test_a_new_lr_on_resume_also_moves_clipups_speed_cap(tmp_path):
    import nesgpu
    from nesgpu.strategies import PGPE, StepSizes

    net = nesgpu.convert(torch.nn.Linear(3, 2), "lowrank")
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    optimizer = PGPE(4, num_perturbed=pm.num_perturbed).make_optimizer(pm.parameters(), lr=0.15)
    cap = optimizer.param_groups[0]["max_speed"]
    StepSizes(optimizer).set_base(0.015, step=0)
    assert optimizer.param_groups[0]["lr"] == 0.015
    assert optimizer.param_groups[0]["max_speed"] == pytest.approx(cap / 10)


def test_a_callback_returning_a_numpy_bool_stops_the_run(tmp_path):
    import numpy as np

    summary = train(TrainConfig.flat(**RUN, out=str(tmp_path / "run")), log=quiet,
                    callback=lambda step, row: np.float64(step) >= 2)
    assert summary["steps"] == 2


def test_progress_and_notes_go_to_stderr_and_stdout_is_the_summary(tmp_path, capsys):
    assert main(["train", "--task", "cartpole", "--population", "16", "--steps", "3", "--hidden", "4",
                 "--progress-every", "1e-9", "--out", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["steps"] == 3  # stdout: the summary JSON, alone
    assert "step 1/3" in captured.err


def test_broken_yaml_and_resume_with_another_out_are_one_line_errors(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("a: [\n")
    with pytest.raises(ValueError, match="is not valid YAML"):
        TrainConfig.from_yaml(path)
    with pytest.raises(ValueError, match="cannot read the config file"):
        TrainConfig.from_yaml(tmp_path / "missing.yaml")
    out = tmp_path / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=quiet)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--resume", str(out), "--out", str(tmp_path / "other")])
    assert exit_info.value.code == 2 and not (tmp_path / "other").exists()


@pytest.mark.parametrize("name", ["metrics.csv", "checkpoint", "tensorboard", "summary.json"])
def test_no_run_file_is_written_through_a_symbolic_link(tmp_path, name):
    train(TrainConfig.flat(**{**RUN, "steps": 2}, log="none", out=str(tmp_path / "run")), log=quiet)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    target = tmp_path / "run" / name
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    target.symlink_to(outside / "precious.txt" if "." in name else outside)
    for options in (dict(resume=True), dict(overwrite=True)):
        with pytest.raises(ValueError, match=f"{name} is a symbolic link; a run writes its files only inside"):
            train(TrainConfig.flat(**RUN, log="none", out=str(tmp_path / "run")), log=quiet, **options)
    assert (outside / "precious.txt").read_text() == "keep me" and sorted(os.listdir(outside)) == ["precious.txt"]


@pytest.mark.parametrize("flags, match", [
    (["--init", "he"], r"differ from its checkpoint \(init: 'default' -> 'he'\)"),
    (["--strategy", "backprop", "--optimizer", "sgd"], r"\(optimizer: 'adamw' -> 'sgd'\)"),
])
def test_resume_refuses_a_new_init_or_optimizer_before_writing(tmp_path, capsys, flags, match):
    side = ["--strategy", "backprop"] if "backprop" in flags else ["--population", "16"]
    out = str(tmp_path / "r")
    assert main(["train", "--task", "digits", "--steps", "2", "--log", "none", *side, "--out", out]) == 0
    config = (tmp_path / "r" / "config.json").read_text()
    with pytest.raises(SystemExit):
        main(["train", "--resume", out, "--steps", "4", *flags])
    assert re.search(match, capsys.readouterr().err.strip().splitlines()[-1])
    assert (tmp_path / "r" / "config.json").read_text() == config


def test_resume_of_a_config_json_that_is_not_a_mapping_is_one_line(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text("[1, 2]")
    with pytest.raises(SystemExit):
        main(["train", "--resume", str(tmp_path / "r"), "--steps", "4"])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # the file, what it holds and what was expected
    assert re.search(r"r/config.json.*(holds a list|got a list)", last) and "mapping of options" in last, last


@pytest.mark.parametrize("options, stopped", [
    (dict(), "steps"),
    (dict(target=-1.0), "target"),
    (dict(callback=lambda step, row: step == 2), "callback"),
])
def test_summary_says_why_the_run_stopped_its_best_value_and_size(tmp_path, options, stopped):
    callback = options.pop("callback", None)
    summary = train(TrainConfig.flat(**{**RUN, "eval_every": 1}, **options, log="none", out=str(tmp_path / "run")),
                    log=quiet, callback=callback)
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["stopped"] == summary["stopped"] == stopped
    assert written["target"] == options.get("target", summary["target"])
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    evaluations = [float(r[summary["metric"]]) for r in rows if r[summary["metric"]]]
    assert written["best"] == max(evaluations + [written["value"]]) >= written["value"]
    assert written["parameters"] == 4 * 4 + 4 + 4 * 2 + 2  # cartpole's MLP, hidden 4: 4 -> 4 -> 2


def test_an_out_that_is_a_dangling_symlink_is_named_as_one(tmp_path):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(ValueError, match=r"is a symbolic link to .*gone, which does not exist"):
        train(TrainConfig.flat(**RUN, out=str(link)), log=quiet)


def test_a_checkpoints_task_without_model_says_so():
    with pytest.raises(ValueError, match="needs --model hf:DIR, a local Hugging Face model directory; no --model was "
                                         "given"):
        TrainConfig(task="arithmetic").resolved()
