"""A training run: its directory, its lock, Ctrl-C, resume, the steps, and the files it leaves.

The steps themselves are :class:`~nesgpu.train.loop.Loop`'s; what is trained, :func:`~nesgpu.train.setup.build.build`'s
(the config's built-in task and model, or the caller's own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..distributed import Ranks, init_from_environment
from ..tasks.protocol import SavesModel
from ..version import __version__
from .loop import Interrupted, Loop, Progress, check_finite, evaluated, shown_statistics
from .setup.build import Built, build, check_own, resolve_device
from .setup.config import TrainConfig, is_supervised
from .setup.own_task import resolve_for
from .setup.defaults import budget_note, compiles, kept_compile, torch_env_tasks
from .setup.paths import with_absolute_paths
from .storage import rundir
from .storage.checkpoint import (STATE, find_checkpoint, read_state, require_safetensors, save_weights,
                                 write_directory, write_json)
from .storage.loggers import make_loggers
from .storage.metrics import MetricsLog, plot_curve
from .storage.resume import resume as resume_run


class StopRequests:
    """Whether SIGINT / SIGTERM asked the run to stop (call it). While steps run (:meth:`deferred`), the first
    signal asks to stop at the end of the current step, with a checkpoint, and a second one stops at once;
    outside them (the task being built, a model loaded, its chat template rendered, the final evaluation)
    the first one stops at once: no step would end to stop at."""

    def __init__(self):
        self.signals: list[int] = []
        self.deferring = False

    def __call__(self) -> bool:
        return bool(self.signals)

    def handle(self, signum, frame) -> None:
        if self.signals or not self.deferring:
            raise KeyboardInterrupt
        self.signals.append(signum)
        print("stopping at the end of this step, with a checkpoint (again to stop at once)", file=sys.stderr,
              flush=True)

    @contextlib.contextmanager
    def deferred(self):
        """Signals wait for the end of the step while this lasts."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False


@contextlib.contextmanager
def _stop_requests(enabled: bool):
    """Yields what tells whether SIGINT / SIGTERM asked the run to stop (a :class:`StopRequests`), its
    handler installed for the run where it can be (the main thread)."""
    requests = StopRequests()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield requests
        return
    saved = {sig: signal.signal(sig, requests.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requests
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def _log_to_stderr(*args, **kwargs) -> None:
    print(*args, file=sys.stderr, **kwargs)  # stdout carries the summary JSON only


@dataclass
class _Job:
    """What one process of a run is asked to do."""

    cfg: TrainConfig
    out: Path
    device: torch.device
    ranks: Ranks
    resume: bool
    overwrite: bool
    log: object
    callback: object
    stop_requested: object
    model: nn.Module | None
    task: object


def train(cfg: TrainConfig, resume: bool = False, log=_log_to_stderr, overwrite: bool = False,
          callback=None, model: nn.Module | None = None, task=None) -> dict:
    """Run (or resume) a training run; returns the summary written to ``summary.json``.

    ``model`` (any nn.Module: converted with the config's layer options, or already converted) and ``task``
    (any :class:`~nesgpu.tasks.protocol.Task`, e.g. a ``ClassificationTask`` over your tensors) replace the
    config's built-in ones and get the whole run machinery: run directory, checkpoints, resume (pass the
    same model and task again with ``resume=True``), metrics and trackers. A custom task's run is labelled
    ``custom:<its name>``.

    A new run refuses an existing run directory unless ``overwrite``; a lock file keeps a second process
    out of a live run. Ctrl-C (or SIGTERM) stops at the end of the current step with a checkpoint and
    raises :class:`Interrupted`. ``callback(step, row)``, if given, runs on rank 0 after every step with that
    step's metrics (the row of metrics.csv; the task's metric on evaluation steps); returning True stops the
    run there, with a checkpoint, as a finished run (an exception it raises, e.g. Optuna's TrialPruned,
    propagates). Progress and notes go to ``log`` (standard error by default). Under torchrun
    (WORLD_SIZE > 1) every process runs this; ranks split the directions, exchange fitness, and compute the
    same update. Only rank 0 writes files.
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train needs a TrainConfig, e.g. TrainConfig(task='digits') or "
                        f"TrainConfig.from_dict(options); got {type(cfg).__name__}")
    cfg = resolve_for(cfg, task)
    check_own(cfg, model, task)
    require_safetensors()
    if cfg.out is None:  # the default: a new directory per run, never an old run's
        cfg.out = str(rundir.fresh_directory(Path("runs"), cfg.task.replace(":", "-").replace("/", "-")))
    out = Path(cfg.out)  # as given, in messages; config.json records every path absolute (resume from anywhere)
    cfg = with_absolute_paths(cfg)
    device = resolve_device(cfg.device)
    if device.type == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # vLLM's in-process engine (--engine vllm) makes torch.distributed's default group its own: the ranks keep theirs
    ranks = init_from_environment(device, cfg.dist_timeout, own_group=_engine(cfg, task) == "vllm")
    try:
        lock = rundir.RunLock(out) if ranks.is_main else contextlib.nullcontext()
        # distributed ranks stop together through the collective timeout, not at a signal of their own
        with lock, _stop_requests(enabled=not ranks.distributed) as stop_requested:
            if ranks.is_main:
                rundir.check(out, resume, overwrite)
            job = _Job(cfg, out, device, ranks, resume, overwrite, log if ranks.is_main else (lambda *a, **k: None),
                       callback, stop_requested, model, task)
            summary = _train(job)
        ranks.barrier()  # tear the group down together, once rank 0 has written its files
        return summary
    finally:  # after an error, without the barrier: a dead peer would make it wait for the timeout
        if ranks.distributed:  # free the run's modules (FSDP's hold the process group in reference cycles)
            gc.collect()  # before the group goes: freed after it, gloo could abort the process at exit
            ranks.close()


def _engine(cfg: TrainConfig, task) -> str | None:
    """The engine a generation task generates on (its ``engine``: "hf" or "vllm"), or None."""
    return getattr(task, "engine", None) if task is not None else cfg.option("engine")


def _train(job: _Job) -> dict:
    cfg, out, main = job.cfg, job.out, job.ranks.is_main
    built_cfg, compiled = _compile_decision(job)
    built = build(built_cfg, job.device, job.ranks, model=job.model, task=job.task, log=job.log)
    loggers = make_loggers(None if cfg.log is None else cfg.log.split(","), out) if main else []
    replaced = rundir.Replacement(out)
    with job.stop_requested.deferred():  # a signal here must not leave an --overwrite's old run set aside
        if main:  # only now that the new run is built: a mistyped option must not cost the old run
            rundir.clear(out)
            if job.overwrite and not job.resume:
                replaced.stash()  # deleted after the new run's first step; back if the run fails before it
    metrics = None
    try:
        progress = resume_run(cfg, out, built.step, is_supervised(cfg.task, built.task), job.log, built.task) \
            if job.resume else Progress()
        metrics = MetricsLog(out, resume_step=built.step.step if job.resume else 0, loggers=loggers,
                             config=cfg.to_dict(), extra_columns=[
                                 *shown_statistics(built.task, built.step.progress_key),
                                 *getattr(built.step, "columns", ()), built.task.metric]) \
            if main else None
        if main:  # once the run's files are read: a resume refused for one of them leaves config.json as it was
            write_json(out / "config.json", json.loads(cfg.to_json()))
        loop = Loop(cfg, out, built.task, built.step, main, job.ranks.distributed, metrics, job.log,
                    _first_step_then(replaced.discard, job.callback, job.stop_requested), job.stop_requested,
                    progress, compiled)
        with job.stop_requested.deferred():
            loop.run()
        built.step.finish()
        summary = {**_summary(cfg, built, job, progress), "stopped": loop.stopped, "target": loop.target}
        if loop.watch.share is not None:  # the share of ES steps whose members all tied (no update)
            summary["steps_without_signal"] = round(loop.watch.share, 4)
        if main:
            _write_results(cfg, out, built, summary, metrics, progress, job.log)
    except BaseException as e:  # the trackers' runs end as killed (Ctrl-C) or failed
        if metrics is not None:
            metrics.close(status="KILLED" if isinstance(e, (Interrupted, KeyboardInterrupt)) else "FAILED")
        if replaced.aside is not None:
            replaced.restore()
            if isinstance(e, Interrupted):  # not "continue with --resume": the new run's files are gone
                raise Interrupted(out, e.step, f"interrupted at the new run's first step: the old run in {out} "
                                               f"is kept as it was") from None
            job.log(f"the old run in {out} is kept: the new run failed before its first step")
        raise
    if metrics is not None:
        metrics.close(summary)
    return summary


def _compile_decision(job: _Job) -> tuple[TrainConfig, bool]:
    """The config the run is built from, and whether its rollouts compile: a resumed run keeps its start's
    decision (:func:`kept_compile`). The console says so where its new options alone would decide otherwise,
    and how a time budget counts compiling."""
    cfg = job.cfg
    compiled, note = compiles(cfg), None
    if job.resume and cfg.compile == "auto" and cfg.task in torch_env_tasks():
        compiled, note = kept_compile(cfg, *_recorded_compile(job.out))
    for line in (note, budget_note(cfg, compiled)):
        if line is not None:
            job.log(line)
    if compiled == compiles(cfg):
        return cfg, compiled
    return dataclasses.replace(cfg, compile="on" if compiled else "off"), compiled


def _recorded_compile(out: Path) -> tuple[bool | None, dict]:
    """Whether ``out``'s checkpoint records that its rollouts ran compiled (None: it does not say), and the
    config it records ({}: none). A checkpoint that cannot be read gives (None, {}): resuming it says why."""
    found = find_checkpoint(out / "checkpoint")
    if found is None:
        return None, {}
    try:
        state = read_state(found / STATE)
    except (OSError, ValueError):  # any damage is reported by resume, which reads the file again
        return None, {}
    recorded, config = state.get("compiled"), state.get("config")
    return (recorded if isinstance(recorded, bool) else None), (config if isinstance(config, dict) else {})


def _first_step_then(settle, callback, stop_requested):
    """The loop's callback: ``settle()`` after every step (the first one's does the work), then ``callback``. A
    step during which a stop was asked for (Ctrl-C) settles nothing: an --overwrite's old run stays until the
    new run has made a step it goes on from."""
    def after_step(step: int, row: dict) -> bool:
        if not stop_requested():
            settle()
        return callback is not None and bool(callback(step, row))
    return after_step


def _summary(cfg: TrainConfig, built: Built, job: _Job, progress: Progress) -> dict:
    """summary.json's fields, in their order, before the final evaluation."""
    of_step = built.step.summary(cfg)  # an ES run's lr: its base step size (--lr auto: the one sigma gave)
    summary = {"task": cfg.task, "metric": built.task.metric, "value": None, "steps": built.step.step,
               "seconds": round(progress.elapsed, 3), "env_steps": progress.env_steps, "strategy": cfg.strategy,
               **of_step, "lr": of_step.get("lr", cfg.lr), "seed": cfg.seed, "device": str(job.device),
               "processes": job.ranks.world, "chunk_size": built.step.chunk, "precision": cfg.precision,
               "dtype": str(next(built.model.parameters()).dtype).removeprefix("torch.")}
    if cfg.bits is not None:
        summary.update(bits=cfg.bits, noise_on=cfg.noise_on, act_bits=cfg.act_bits)
    return summary


def _write_results(cfg: TrainConfig, out: Path, built: Built, summary: dict, metrics, progress: Progress,
                   log) -> None:
    """Rank 0: the final evaluation, the weights, the curve and summary.json."""
    log(f"final evaluation of the model after step {built.step.step} ({built.task.metric})")
    started = time.perf_counter()
    summary["value"] = evaluated(built.task, built.model)
    final = time.perf_counter() - started  # summary.json's seconds: the training and this evaluation
    summary.update(seconds=round(progress.elapsed + final, 3), final_evaluation_seconds=round(final, 3))
    metric = built.task.metric  # the best evaluation of the run (its earlier evaluations and this one)
    summary["best"] = max([summary["value"], *(float(r[metric]) for r in metrics.rows if r.get(metric) not in
                                               (None, ""))])
    summary["parameters"] = sum(p.numel() for p in built.model.parameters() if p.requires_grad)  # that evolve
    summary["parameters_total"] = sum(p.numel() for p in built.model.parameters())  # a LoRA run's base model too
    summary["versions"] = {"nesgpu": __version__, "torch": torch.__version__}
    check_finite(built.step, built.step.step, progress.last_checkpoint, out / "checkpoint")
    save_weights(built.model, out / "model.safetensors", metadata={"nesgpu_config": cfg.to_json(),
                                                                    "nesgpu_version": __version__})
    if isinstance(built.task, SavesModel):  # e.g. a language model, for from_pretrained
        write_directory(out / "hf", lambda tmp: built.task.save(built.model, tmp))  # atomically, files 0644
    plot_curve(metrics.rows, built.task.metric, out / "curve.png", f"{cfg.task}: {cfg.strategy}, {cfg.layer}")
    write_json(out / "summary.json", summary)
    log(f"{cfg.task}: {built.task.metric} = {summary['value']:.4f} after {built.step.step} steps in "
        f"{progress.elapsed:.1f} s (and {final:.1f} s of final evaluation) -> {out}")


__all__ = ["Interrupted", "train"]
