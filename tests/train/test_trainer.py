"""The trainer end to end: files written, exact resume, atomic checkpoints, and clear errors."""

import json
import os
import shutil
import signal
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file

from nesgpu.cli import main
from nesgpu.train import TrainConfig, evaluate_run, train
from nesgpu.train.storage.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint

FAST = {
    "digits": dict(task="digits", population=16, steps=6, batch_size=8, hidden=(8,)),
    "cartpole": dict(task="cartpole", population=16, steps=6, hidden=(4,)),
}


def quiet(*args, **kwargs):
    pass


@pytest.mark.parametrize("name", sorted(FAST))
def test_run_writes_every_output(tmp_path, name):
    summary = train(TrainConfig.flat(**FAST[name], out=str(tmp_path)), log=quiet)
    for f in ["summary.json", "metrics.csv", "config.json", "model.safetensors", "curve.png",
              "checkpoint/model.safetensors", "checkpoint/state.pt"]:
        assert (tmp_path / f).is_file(), f
    assert any((tmp_path / "tensorboard").iterdir())
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    assert set(on_disk) >= {"task", "metric", "value", "steps", "seconds"}
    assert on_disk["metric"] == ("test_accuracy" if name == "digits" else "eval_return")
    assert len((tmp_path / "metrics.csv").read_text().strip().splitlines()) == 1 + 1 + 6  # the header, step 0, steps 1-6
    # the saved weights load into the plain model, and eval reproduces the summary's value
    assert evaluate_run(tmp_path, "cpu")["value"] == pytest.approx(summary["value"])


class Crash(Exception):
    pass


@pytest.mark.parametrize("name", sorted(FAST))
@pytest.mark.parametrize("strategy", ["openai_es", "ars", "pgpe"])
def test_resume_after_a_crash_ends_with_identical_weights(tmp_path, monkeypatch, name, strategy):
    cfg = dict(FAST[name], strategy=strategy, lr_schedule="cosine", lr_final=0.1, checkpoint_every=2)
    train(TrainConfig.flat(**cfg, out=str(tmp_path / "straight")), log=quiet)

    from nesgpu.tasks import ClassificationTask, RLTask

    task_cls = ClassificationTask if name == "digits" else RLTask
    original = task_cls.fitness

    def crash_at_step_4(self, pm, step):
        if step == 4:
            raise Crash("killed")
        return original(self, pm, step)

    monkeypatch.setattr(task_cls, "fitness", crash_at_step_4)
    with pytest.raises(Crash):
        train(TrainConfig.flat(**cfg, out=str(tmp_path / "split")), log=quiet)
    monkeypatch.setattr(task_cls, "fitness", original)
    rows = (tmp_path / "split" / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 1 + 3  # step 0 and steps 1-3 ran; the checkpoint holds step 2
    train(TrainConfig.flat(**cfg, out=str(tmp_path / "split")), resume=True, log=quiet)
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "split" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = (tmp_path / "split" / "metrics.csv").read_text().strip().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == [str(i) for i in range(0, 7)]


def test_failure_mid_save_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path / "ckpt", model, {"step": 1})
    import nesgpu.train.storage.checkpoint as ck

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_weights", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "ckpt", torch.nn.Linear(3, 2), {"step": 2})
    restored = torch.nn.Linear(3, 2)
    assert load_checkpoint(tmp_path / "ckpt", restored) == {"step": 1}
    assert torch.equal(restored.weight, model.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary left behind


def test_checkpoint_found_between_the_two_renames(tmp_path):
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path / "ckpt", model, {"step": 1})
    os.replace(tmp_path / "ckpt", tmp_path / "ckpt.prev")  # a crash right after the first rename
    assert find_checkpoint(tmp_path / "ckpt") == tmp_path / "ckpt.prev"
    assert load_checkpoint(tmp_path / "ckpt", torch.nn.Linear(3, 2)) == {"step": 1}


KILLER = """
import sys, torch
from nesgpu.train.storage.checkpoint import save_checkpoint
model = torch.nn.Linear(1000, 1000)
step = 0
while True:
    step += 1
    with torch.no_grad():
        model.weight.fill_(step)
    save_checkpoint(sys.argv[1], model, {"step": step})
    print(step, flush=True)
"""


def test_process_killed_mid_save_leaves_a_usable_checkpoint(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(tmp_path / "ckpt")], stdout=subprocess.PIPE)
    try:
        saved = [proc.stdout.readline() for _ in range(5)]  # five complete saves: the kill falls inside a later one
        assert saved == [b"%d\n" % step for step in range(1, 6)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        proc.kill()
    model = torch.nn.Linear(1000, 1000)
    state = load_checkpoint(tmp_path / "ckpt", model)
    assert state["step"] >= 5 and torch.all(model.weight == state["step"])


def test_corrupt_and_mismatched_checkpoints_are_reported(tmp_path):
    train(TrainConfig.flat(**FAST["cartpole"], out=str(tmp_path / "run")), log=quiet)
    with pytest.raises(ValueError, match=r"options that define the run differ from its checkpoint \(hidden: "
                                         r"\(4,\) -> \(5,\)\)"):
        train(TrainConfig.flat(**{**FAST["cartpole"], "hidden": (5,), "steps": 8}, out=str(tmp_path / "run")),
              resume=True, log=quiet)
    with pytest.raises(ValueError, match="for task 'cartpole', not 'acrobot'"):
        train(TrainConfig.flat(**{**FAST["cartpole"], "task": "acrobot", "steps": 8}, out=str(tmp_path / "run")),
              resume=True, log=quiet)
    (tmp_path / "run" / "checkpoint" / "state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupt"):
        train(TrainConfig.flat(**{**FAST["cartpole"], "steps": 8}, out=str(tmp_path / "run")), resume=True, log=quiet)
    train(TrainConfig.flat(**FAST["cartpole"], out=str(tmp_path / "run2")), log=quiet)
    (tmp_path / "run2" / "checkpoint" / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ValueError, match="model.safetensors: the file is corrupt"):
        train(TrainConfig.flat(**{**FAST["cartpole"], "steps": 8}, out=str(tmp_path / "run2")), resume=True, log=quiet)
    with pytest.raises(ValueError, match="no checkpoint"):
        train(TrainConfig.flat(**FAST["cartpole"], out=str(tmp_path / "empty")), resume=True, log=quiet)


@pytest.mark.parametrize("options,message", [
    ({"task": "chess"}, "unknown task 'chess'"),
    ({"strategy": "cma"}, "unknown strategy 'cma'"),
    ({"layer": "dense"}, r"layer must be one of \['flipout', .*got 'dense'"),
    ({"sigma": 0.0}, "sigma must be a positive finite number or .auto.; got 0.0"),
    ({"sigma": -1.0}, "sigma must be a positive"),
    ({"population": 1}, "population must be >= 2; got 1"),
    ({"population": 17}, "population must be even with antithetic sampling"),
    ({"lr": 0.0}, "lr must be a positive finite number"),
    ({"task": "gym:NoSuchEnv-v0"}, "unknown task 'gym:NoSuchEnv-v0'"),
    ({"layer": "permuted", "antithetic": False}, "'permuted' is biased without antithetic sampling"),
    ({"seed": 2**70}, r"seed must be below 2\*\*63"),
    ({"sigma": float("inf")}, "sigma must be a positive finite number"),
])
def test_bad_configuration_is_a_clear_error(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        train(TrainConfig.flat(**{**FAST["cartpole"], **options}, out=str(tmp_path)), log=quiet)


def _damage_step(state):
    state["strategy"]["step"] = -3


def _damage_optimizer(state):
    moments = next(iter(state["strategy"]["optimizer"]["state"].values()))
    next(v for v in moments.values() if v.is_floating_point() and v.dim()).view(-1)[0] = float("nan")


@pytest.mark.parametrize("damage, message", [
    (_damage_step, r"is at step -3; expected a whole number >= 0"),
    (_damage_optimizer, r"optimizer state holds NaN or infinite values \(optimizer.state.0.\w+\); it cannot be "
                        r"resumed"),
    (lambda state: state.pop("strategy"), "has no strategy state"),
])
def test_a_damaged_checkpoint_is_refused_before_it_is_resumed(tmp_path, damage, message):
    train(TrainConfig.flat(**FAST["cartpole"], out=str(tmp_path / "run")), log=quiet)
    path = find_checkpoint(tmp_path / "run" / "checkpoint") / "state.pt"
    state = torch.load(path, weights_only=True)
    damage(state)
    torch.save(state, path)
    metrics = (tmp_path / "run" / "metrics.csv").read_text()
    with pytest.raises(ValueError, match=message):
        train(TrainConfig.flat(**{**FAST["cartpole"], "steps": 8}, out=str(tmp_path / "run")), resume=True, log=quiet)
    assert (tmp_path / "run" / "metrics.csv").read_text() == metrics


def test_nan_fitness_names_step_and_member(tmp_path, monkeypatch):
    from nesgpu.tasks.rl import RLTask

    original = RLTask.fitness

    def poisoned(self, pm, step):
        f, info = original(self, pm, step)
        if step == 3:
            f[0, 2] = float("inf")
        return f, info

    monkeypatch.setattr(RLTask, "fitness", poisoned)
    with pytest.raises(ValueError, match=r"non-finite fitness inf at step 3, member \(repeat 0, direction 2\)"):
        train(TrainConfig.flat(**FAST["cartpole"], out=str(tmp_path)), log=quiet)


def test_cli_train_config_file_flags_and_eval(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("task: cartpole\nstrategy: openai_es\npopulation: 16\nsteps: 4\nhidden: [4]\nsigma: 0.2\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--steps", "5", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 5 and summary["sigma"] == 0.2 and summary["task"] == "cartpole"
    assert main(["train", "--resume", str(out), "--steps", "7"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 7
    assert main(["eval", str(out), "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["metric"] == "eval_return"
    config.write_text("tsak: cartpole\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(config), "--out", str(out)])
    assert exit_info.value.code == 2
    assert "unknown option(s) ['tsak']" in capsys.readouterr().err


def test_cli_warnings_are_one_line(tmp_path, capsys):
    # a kind without an embedding product: the sequence model's embeddings take IID noise, said once each
    assert main(["train", "--task", "reverse", "--layer", "flipout", "--steps", "1", "--population", "8",
                 "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "nesgpu: warning: tokens (Embedding): kind 'flipout' has no embedding product" in err
    assert "convert(" not in err  # no source line, no traceback


def test_python_dash_m_works_like_the_script(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "cartpole", "--population", "8",
                             "--steps", "2", "--hidden", "4", "--out", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["task"] == "cartpole"


# ----- scale: chunks, precision, processes -------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAST))
@pytest.mark.parametrize("strategy", ["openai_es", "ars", "pgpe"])
def test_chunked_run_equals_unchunked(tmp_path, name, strategy):
    cfg = dict(FAST[name], strategy=strategy, population=32)
    train(TrainConfig.flat(**cfg, out=str(tmp_path / "whole")), log=quiet)
    summary = train(TrainConfig.flat(**cfg, chunk_size=5, out=str(tmp_path / "chunked")), log=quiet)
    assert summary["chunk_size"] == 5
    a = load_file(tmp_path / "whole" / "model.safetensors")
    b = load_file(tmp_path / "chunked" / "model.safetensors")
    for k in a:  # equal up to float rounding (blocks change the order of the sums)
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


# what torch raises when a device runs out of memory: CUDA's error, and the CPU allocator's RuntimeError
OUT_OF_MEMORY = {
    "cuda": lambda: torch.OutOfMemoryError("CUDA out of memory (simulated)"),
    "cpu": lambda: RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                                "memory: you tried to allocate 35184372088832 bytes. Error code 12 (simulated)"),
}


@pytest.mark.parametrize("device", sorted(OUT_OF_MEMORY))
def test_auto_chunk_recovers_from_out_of_memory(tmp_path, monkeypatch, device):
    from nesgpu.tasks import ClassificationTask

    original = ClassificationTask.fitness
    calls = []

    def small_memory(self, pm, step):
        calls.append(pm.local_directions)
        if pm.local_directions > 4:
            raise OUT_OF_MEMORY[device]()
        return original(self, pm, step)

    monkeypatch.setattr(ClassificationTask, "fitness", small_memory)
    logs = []
    summary = train(TrainConfig.flat(**FAST["digits"], chunk_size="auto", out=str(tmp_path / "auto")), log=logs.append)
    assert summary["chunk_size"] == 4 and calls[:3] == [8, 4, 4]
    assert any("retrying the step with chunk size 4" in line for line in logs)
    monkeypatch.setattr(ClassificationTask, "fitness", original)
    train(TrainConfig.flat(**FAST["digits"], chunk_size=4, out=str(tmp_path / "fixed")), log=quiet)
    a = load_file(tmp_path / "auto" / "model.safetensors")
    b = load_file(tmp_path / "fixed" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)  # no step lost or repeated


def test_auto_chunk_also_covers_the_noise_draw(tmp_path, monkeypatch):
    from nesgpu import PerturbedModel

    original = PerturbedModel.set_noise

    def small_memory(self, step=None, directions=None, sigma=None):
        if directions is None or len(directions) > 4:  # the whole population's noise does not fit
            raise OUT_OF_MEMORY["cpu"]()
        return original(self, step, directions, sigma)

    monkeypatch.setattr(PerturbedModel, "set_noise", small_memory)
    summary = train(TrainConfig.flat(**FAST["digits"], chunk_size="auto", out=str(tmp_path / "auto")), log=quiet)
    assert summary["chunk_size"] == 4 and summary["steps"] == FAST["digits"]["steps"]


def test_other_errors_are_not_taken_for_out_of_memory(tmp_path, monkeypatch):
    from nesgpu.tasks import ClassificationTask

    def broken(self, pm, step):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(ClassificationTask, "fitness", broken)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        train(TrainConfig.flat(**FAST["digits"], chunk_size="auto", out=str(tmp_path)), log=quiet)


@pytest.mark.parametrize("task", ["cartpole", "gym:Pendulum-v1"])
def test_reduced_precision_policies_drive_torch_and_gym_environments(tmp_path, task):
    if task.startswith("gym:"):
        pytest.importorskip("gymnasium")
    # numpy has no bf16: the rollout hands environments float32 actions
    summary = train(TrainConfig(task=task, population=8, steps=2, hidden=(4,), precision="bf16",
                                out=str(tmp_path)), log=quiet)
    assert summary["precision"] == "bf16" and summary["env_steps"] > 0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_runs_and_keeps_fp32_master_weights(tmp_path, precision):
    summary = train(TrainConfig.flat(**FAST["digits"], precision=precision, out=str(tmp_path)), log=quiet)
    weights = load_file(tmp_path / "model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert summary["precision"] == precision and 0.0 <= summary["value"] <= 1.0
    with pytest.raises(ValueError, match="precision must be one of"):
        train(TrainConfig.flat(**FAST["digits"], precision="fp8", out=str(tmp_path)), log=quiet)


def test_eval_of_an_unfinished_run_uses_its_checkpoint_with_a_warning(tmp_path, capsys):
    out = tmp_path / "run"
    train(TrainConfig.flat(**FAST["digits"], checkpoint_every=2, out=str(out)), log=quiet)
    (out / "model.safetensors").unlink()  # as a run interrupted before its end leaves it
    with pytest.warns(UserWarning, match=r"has not finished \(no model.safetensors\): using its last checkpoint, "
                                         r"step 6; continue it with nesgpu train --resume"):
        value = evaluate_run(out, "cpu")["value"]
    assert 0 <= value <= 1
    for f in ("checkpoint", "checkpoint.prev"):
        if (out / f).exists():
            shutil.rmtree(out / f)
    with pytest.raises(SystemExit) as e:
        main(["eval", str(out)])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert "holds no weights yet (no model.safetensors, no checkpoint)" in err and "Traceback" not in err


def test_evolve_matrices_trains_only_the_weight_matrices(tmp_path):
    """--evolve matrices: biases stay bit for bit from step 3 to step 6 (they moved under "all"), weight matrices
    move; the option defines the run (resuming without it is refused)."""
    def weights(name, steps, **options):
        train(TrainConfig.flat(**{**FAST["digits"], "steps": steps}, **options, out=str(tmp_path / name)), log=quiet)
        return load_file(tmp_path / name / "model.safetensors")

    everything = weights("all3", 3), weights("all6", 6)
    matrices = weights("mat3", 3, evolve="matrices"), weights("mat6", 6, evolve="matrices")
    biases = [n for n, v in matrices[0].items() if v.dim() == 1]
    assert biases and all(not torch.equal(everything[0][n], everything[1][n]) for n in biases)
    assert all(torch.equal(matrices[0][n], matrices[1][n]) for n in biases)
    assert all(not torch.equal(matrices[0][n], v) for n, v in matrices[1].items() if v.dim() == 2)
    with pytest.raises(ValueError, match="evolve"):
        train(TrainConfig.flat(**{**FAST["digits"], "steps": 8}, out=str(tmp_path / "mat6")), resume=True, log=quiet)


def test_a_schedule_under_a_time_budget_is_named_as_running_over_the_steps(tmp_path):
    """A schedule follows --steps: a --time-budget run that stops long before says so, not silently constant."""
    with pytest.warns(UserWarning, match=r"the sigma and lr schedule runs over --steps \(100000\), not over "
                                         r"--time-budget"):
        train(TrainConfig.flat(**{**FAST["digits"], "steps": 100_000}, time_budget=1.0, sigma_schedule="cosine",
                          lr_schedule="linear", out=str(tmp_path / "both")), log=quiet)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no schedule, or no budget: no warning
        train(TrainConfig.flat(**FAST["digits"], time_budget=60.0, out=str(tmp_path / "plain")), log=quiet)
        train(TrainConfig.flat(**FAST["digits"], sigma_schedule="cosine", out=str(tmp_path / "steps")), log=quiet)


@pytest.mark.parametrize("given", [None, {}, "digits"])
def test_train_without_a_config_is_a_type_error_naming_it(given):
    with pytest.raises(TypeError, match=f"train needs a TrainConfig.*; got {type(given).__name__}"):
        train(given)
