"""The study of ``nesgpu tune``: one trial = one ``train()`` run in ``DIR/trials/NNNN``, scored by its final
metric (higher is better), pruned from its intermediate evaluations.

The loop (:func:`optimize`) is Optuna's ask-and-tell. Each round, under the directory's lock: mark the trials
of killed processes failed, count the finished trials (complete, pruned, or failed on their own) and the
running ones, and start a
new trial only while finished + running stays below the cap. So the cap holds exactly across any number of
processes; a process whose only missing trials are running elsewhere waits for them (they may fail and free
their place) and stops at the cap or at its timeout.

A trial whose config the trainer refuses, or whose run diverges (a ValueError), or that runs out of GPU
memory, is recorded as failed with its message (user attribute ``error``), counts toward the cap, and the
study goes on; a study whose trials all failed so is an error. Ctrl-C marks the running trial failed and
stops the tune; running the same command again continues the study (and redoes that trial).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import sys
import time
import warnings
from pathlib import Path

import optuna
import torch
from optuna.trial import TrialState

from ..tasks import ClassificationTask, RLTask, SequenceTask
from ..train.setup.config import TrainConfig
from ..train.setup.own_task import labelled
from ..train.trainer import Interrupted, train
from .outputs import write_outputs
from .space import SearchSpace, make_space
from .storage import (
    RUN_ONLY,
    as_json,
    heartbeat,
    load_study,
    locked,
    make_directory,
    open_storage,
    quiet_optuna,
    readable_database,
    trial_id,
    writable_directory,
)

SAMPLERS = ("tpe", "gp", "cmaes")
PRUNERS = ("median", "hyperband", "none")
# what a trial's failure may be without stopping the study: a config the trainer refuses, a diverged run
# (non-finite values), a population too large for the GPU, a trial another process marked failed meanwhile
TRIAL_ERRORS = (ValueError, torch.cuda.OutOfMemoryError, optuna.exceptions.UpdateFinishedTrialError)
# the names of the tasks' metrics (metrics.csv columns, present on evaluation steps)
METRICS = tuple(dict.fromkeys(cls.metric for cls in (ClassificationTask, SequenceTask, RLTask)))


def _log_to_stderr(*args, **kwargs) -> None:
    print(*args, file=sys.stderr, **kwargs)


def tune(base: TrainConfig, space: SearchSpace | dict | str | Path | None = None, trials: int | None = None,
         out: str | Path = "tune", *, sampler: str = "tpe", pruner: str | optuna.pruners.BasePruner = "median",
         timeout: float | None = None, study_name: str | None = None, heartbeat: int = 10, plots: bool = True,
         log=_log_to_stderr, model: torch.nn.Module | None = None, task=None) -> optuna.Study:
    """Search the options of ``space`` for the best final metric of ``nesgpu train`` runs of ``base``.

    Running it again with the same ``out`` continues the study (the cap ``trials`` counts the trials of
    every session and process); several processes may run it on one ``out`` at once.

    Args:
        base: the options every trial starts from (unresolved: unset options take the task's presets).
            Its ``out`` is not used: trial N runs in ``out/trials/NNNN``.
        space: the searched options: a mapping or YAML file as in :mod:`nesgpu.tune.space`, or None for the
            default space of the base config's strategy.
        trials: the number of finished trials (complete, pruned, or failed on their own: diverged, refused,
            out of memory) the study stops at; None: no cap (then give a ``timeout``).
        out: the tune directory: ``study.db``, ``trials/``, ``trials.csv``, ``best.yaml``, plots.
        sampler: "tpe" (default), "gp" or "cmaes"; seeded by ``base.seed`` and the trial number.
        pruner: "median" (default), "hyperband", "none", or an Optuna pruner.
        timeout: seconds after which this process starts no new trial (a running trial finishes).
        study_name: the study's name in ``study.db`` (default: the one there, or the directory's name).
        heartbeat: seconds between a running trial's heartbeats; a trial without one for three beats is
            marked failed (its process was killed).
        plots: write the PNG plots at the end.
        log: where the per-trial lines go (standard error by default).
        model, task: your own model and task (as :func:`nesgpu.train.train` takes them): every trial trains a
            fresh copy of ``model``; ``task`` is shared by the trials.

    Returns:
        The Optuna study (``study.best_trial``, ``study.trials``, ...).

    Raises:
        ValueError: a bad option, space, sampler or pruner, or a directory holding another study.
        KeyboardInterrupt, nesgpu.train.Interrupted: Ctrl-C; the running trial is marked failed.
    """
    _check_arguments(trials, timeout, sampler, heartbeat)
    if task is not None:
        base = labelled(base, task)
    subject = Subject(model, task)
    base = _base_config(base)
    space = make_space(base, space)
    _check_sampler(sampler, space)
    study_pruner = make_pruner(pruner, base.resolved(), space)
    out = Path(out)
    attrs = {"base_config": as_json(identity(base)), "space": as_json(space.to_dict()), "sampler": sampler,
             "pruner": pruner if isinstance(pruner, str) else type(pruner).__name__}
    storage, study = _open_study(out, attrs, study_name, heartbeat, make_sampler(sampler, base.seed, 0, trials),
                                 study_pruner, log)
    with quiet_optuna():
        try:  # a full disk while the trials run: the database named, as when it opens
            with readable_database(out):
                optimize(study, storage, base, space, out, trials, timeout, sampler, log, subject)
        except (KeyboardInterrupt, Interrupted):
            write_outputs(study, base, space, out, plots=False, log=log)  # trials.csv shows the stopped trial
            raise
        write_outputs(study, base, space, out, plots=plots, log=log)
    check_any_complete(study)
    return study


@dataclasses.dataclass(frozen=True)
class Subject:
    """What every trial trains when it is not the config's built-in task and model: the user's own."""

    model: torch.nn.Module | None = None
    task: object = None

    def fresh_model(self) -> torch.nn.Module | None:
        """A copy of the model as given (a trial converts and trains its own)."""
        return None if self.model is None else copy.deepcopy(self.model)


def _open_study(out: Path, attrs: dict, study_name: str | None, heartbeat: int, sampler, pruner, log):
    """(storage, study) of the tune directory ``out``: a new study, or the one there if it matches ``attrs``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; expected a directory for the tune (study.db, trials/, ...)")
    make_directory(out)

    def on_stale(study, trial):
        log(f"trial {trial.number} had no heartbeat for {3 * heartbeat} s (its process was killed): marked failed")

    with writable_directory(out), locked(out), readable_database(out):
        storage = open_storage(out, heartbeat, on_stale)
        return storage, load_study(storage, out, study_name, attrs, sampler, pruner)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_arguments(trials, timeout, sampler, heartbeat) -> None:
    if trials is None and timeout is None:
        raise ValueError("give trials (a number of trials), a timeout (seconds), or both")
    if trials is not None and not (_whole(trials) and trials >= 1):
        raise ValueError(f"trials must be a whole number >= 1; got {trials!r}")
    if timeout is not None and not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {list(SAMPLERS)}; got {sampler!r}")
    if not (_whole(heartbeat) and heartbeat >= 1):
        raise ValueError(f"heartbeat must be a whole number of seconds >= 1; got {heartbeat!r}")


def _base_config(base: TrainConfig) -> TrainConfig:
    """The base config without ``out`` (each trial has its own), checked by resolving it."""
    if not isinstance(base, TrainConfig):
        raise TypeError(f"base must be a TrainConfig; got {type(base).__name__}")
    if base.out is not None:
        warnings.warn(f"the base config's out ({base.out}) is not used: trial N runs in DIR/trials/NNNN",
                      stacklevel=3)
        base = dataclasses.replace(base, out=None)
    base.resolved()
    return base


def identity(base: TrainConfig) -> dict:
    """The base config's options that define a study (all but :data:`~nesgpu.tune.storage.RUN_ONLY`)."""
    return {k: v for k, v in base.to_dict().items() if k not in RUN_ONLY}


# ----- samplers and pruners ---------------------------------------------------------------------------
def startup_trials(trials: int | None) -> int:
    """Random trials before TPE or GP model the results: a third of the study, from 2 to 10."""
    return 10 if trials is None else max(2, min(10, trials // 3))


def make_sampler(name: str, seed: int, number: int, trials: int | None) -> optuna.samplers.BaseSampler:
    """The sampler of trial ``number``, seeded by the config's seed and that number: a study's draws do not
    depend on which process runs which trial, and parallel processes do not repeat each other. The samplers
    keep their state in the storage, so a new one per trial continues the study."""
    seed = (seed * 1_000_003 + number) % 2**32
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials(trials))
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials(trials))
    if name == "cmaes":  # categorical options: warned about once (_check_sampler), then drawn at random
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise ValueError(f"sampler must be one of {list(SAMPLERS)}; got {name!r}")


def _check_sampler(name: str, space: SearchSpace) -> None:
    categorical = space.categorical()
    if name == "cmaes" and categorical:
        warnings.warn(f"--sampler cmaes samples numeric options only: {categorical} are drawn at random "
                      f"(Optuna's independent sampler), not by CMA-ES", stacklevel=3)


def make_pruner(pruner: str | optuna.pruners.BasePruner, cfg: TrainConfig,
                space: SearchSpace) -> optuna.pruners.BasePruner:
    """The pruner by name, fitted to the resolved base config's evaluation steps.

    median: stop a trial whose evaluation is below the median of the earlier trials' at the same step (after
    5 trials). hyperband: successive halving from the first evaluation to the last step. none: no pruning.
    """
    if isinstance(pruner, optuna.pruners.BasePruner):
        return pruner
    if pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5)
    if pruner == "hyperband":
        first = cfg.eval_every or max(1, cfg.steps // 10)
        return optuna.pruners.HyperbandPruner(min_resource=first, reduction_factor=3,
                                              max_resource="auto" if "steps" in space.names else cfg.steps)
    if pruner == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"pruner must be one of {list(PRUNERS)} or an optuna pruner; got {pruner!r}")


# ----- the loop -----------------------------------------------------------------------------------------
def counted_failure(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial that failed on its own (diverged, refused, out of memory): it counts toward the cap. One a
    killed process left (no heartbeat) or Ctrl-C stopped does not: running the tune again redoes it."""
    error = trial.user_attrs.get("error")
    return trial.state == TrialState.FAIL and error is not None and not error.startswith("interrupted")


def counts(study: optuna.Study) -> tuple[int, int]:
    """(finished: complete + pruned + failed on their own, running) trials of the study."""
    trials = study.get_trials(deepcopy=False)
    finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) or counted_failure(t) for t in trials)
    return finished, sum(t.state == TrialState.RUNNING for t in trials)


def check_any_complete(study: optuna.Study) -> None:
    """A study whose trials all failed on their own has nothing to report: a ValueError with the last error."""
    trials = study.get_trials(deepcopy=False)
    failed = [t for t in trials if counted_failure(t)]
    if failed and not any(t.state == TrialState.COMPLETE for t in trials):
        raise ValueError(f"every trial failed ({len(failed)}); the last: {failed[-1].user_attrs['error']}. Fix the "
                         f"base config or narrow the search space")


def optimize(study: optuna.Study, storage, base: TrainConfig, space: SearchSpace, out: Path, trials: int | None,
             timeout: float | None, sampler: str, log, subject: Subject | None = None) -> None:
    """Run trials until the study has ``trials`` finished ones or ``timeout`` seconds have passed."""
    start, waiting = time.monotonic(), False
    while timeout is None or time.monotonic() - start < timeout:
        with locked(out):
            optuna.storages.fail_stale_trials(study)
            finished, running = counts(study)
            if trials is not None and finished >= trials:
                return
            trial = None
            if trials is None or finished + running < trials:
                study.sampler = make_sampler(sampler, base.seed, len(study.get_trials(deepcopy=False)), trials)
                trial = study.ask()
                beat_id = trial_id(storage, study, trial.number)
                storage.record_heartbeat(beat_id)  # before the lock is released: a killed process's trial goes stale
        if trial is None:
            if not waiting:
                log(f"waiting for {running} trial(s) running in other processes (a killed process's trial is marked "
                    f"failed after {3 * storage.get_heartbeat_interval()} s without a heartbeat)")
                waiting = True
            time.sleep(storage.get_heartbeat_interval())
            continue
        waiting = False
        with heartbeat(storage, beat_id):
            run_trial(study, trial, base, space, out, log, subject)
        write_outputs(study, base, space, out, plots=False, log=log)


def run_trial(study: optuna.Study, trial: optuna.Trial, base: TrainConfig, space: SearchSpace, out: Path,
              log, subject: Subject | None = None) -> None:
    """Run one trial and tell the study how it ended: complete, pruned or failed (with its message)."""
    run_dir = out / "trials" / f"{trial.number:04d}"
    trial.set_user_attr("run_dir", str(run_dir))
    run_log = RunLog()
    start, summary = time.monotonic(), None
    try:
        summary = objective(trial, base, space, run_dir, run_log, subject)
    except optuna.TrialPruned as e:
        result = _finish(study, trial, f"pruned ({e})", state=TrialState.PRUNED)
    except TRIAL_ERRORS as e:
        result = _finish(study, trial, f"failed: {e}", state=TrialState.FAIL, attrs={"error": str(e)})
    except (KeyboardInterrupt, Interrupted) as e:  # Ctrl-C: the trial fails and the tune stops
        step = f" at step {e.step}" if isinstance(e, Interrupted) else ""
        _finish(study, trial, "", state=TrialState.FAIL, attrs={"error": f"interrupted{step}"})
        raise
    except BaseException as e:  # a bug: the trial fails, and the tune stops with the traceback
        _finish(study, trial, "", state=TrialState.FAIL, attrs={"error": f"{type(e).__name__}: {e}"})
        raise
    else:
        result = _finish(study, trial, f"{summary['metric']} {summary['value']:.4g}", value=summary["value"],
                         attrs={"metric": summary["metric"]})
    for note in run_log.notes(complete=summary is not None):
        log(f"trial {trial.number}: {note}")
    params = ", ".join(f"{k}={_short(v)}" for k, v in trial.params.items())
    log(f"trial {trial.number} {result} with {params or 'the base config'} in {time.monotonic() - start:.1f} s "
        f"-> {run_dir}")


def _finish(study: optuna.Study, trial: optuna.Trial, result: str, value: float | None = None,
            state: TrialState = TrialState.COMPLETE, attrs: dict | None = None) -> str:
    """Record the trial's user attributes ``attrs`` and tell the study its end; returns ``result``, with a note
    when another process had marked the trial failed meanwhile (its heartbeat was three beats late)."""
    try:
        for key, attr in (attrs or {}).items():
            trial.set_user_attr(key, attr)
        told = study.tell(trial, value, state=state, skip_if_finished=True).state
    except optuna.exceptions.UpdateFinishedTrialError:
        told = None
    if state == TrialState.FAIL and torch.cuda.is_available():
        torch.cuda.empty_cache()  # after an out-of-memory trial, for the next one
    if told != state:
        return f"{result}, but another process had marked it failed (its heartbeat was late)"
    return result


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def objective(trial: optuna.Trial, base: TrainConfig, space: SearchSpace, run_dir: Path, log=None,
              subject: Subject | None = None) -> dict:
    """Train the trial's config in ``run_dir``; returns the run's summary (its final metric: ``value``, named
    ``metric``). Raises TrialPruned when pruned, ValueError when the metric is not finite."""
    cfg = space.apply(base, space.suggest(trial))
    cfg.out = str(run_dir)
    callback = PruningCallback(trial, last_step=cfg.resolved().steps)
    subject = subject or Subject()
    summary = train(cfg, log=log or (lambda *a, **k: None), callback=callback, model=subject.fresh_model(),
                    task=subject.task)
    if summary["value"] is None or not math.isfinite(summary["value"]):
        raise ValueError(f"the run's {summary['metric']} is not a finite number: {summary['value']}")
    return summary


class PruningCallback:
    """``train()``'s callback: reports each evaluation of the task's metric to the trial, and raises
    ``optuna.TrialPruned`` when the pruner says so (never at the last step: that trial is complete)."""

    def __init__(self, trial, last_step: int):
        self.trial, self.last_step = trial, last_step

    def __call__(self, step: int, row: dict) -> bool:
        metric = next((m for m in METRICS if m in row), None)
        if metric is None or row[metric] is None or not math.isfinite(row[metric]):
            return False
        self.trial.report(float(row[metric]), step)
        if step < self.last_step and self.trial.should_prune():
            raise optuna.TrialPruned(f"{metric} {row[metric]:.4g} at step {step}")
        return False


class RunLog:
    """``train()``'s log during a trial: keeps its notes (an out-of-memory retry, a reached target), drops
    the progress lines and the final line (the trial's own line says the same)."""

    PROGRESS = re.compile(r"step \d+/\d+ |final evaluation of the model after step ")

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, *args, **kwargs) -> None:
        line = " ".join(map(str, args))
        if not self.PROGRESS.match(line):
            self.lines.append(line)

    def notes(self, complete: bool) -> list[str]:
        """The lines worth showing: of a complete run, all but its last (the final summary line)."""
        return self.lines[:-1] if complete else list(self.lines)


__all__ = ["METRICS", "PRUNERS", "SAMPLERS", "PruningCallback", "counts", "make_pruner", "make_sampler", "objective",
           "optimize", "run_trial", "startup_trials", "tune"]
