"""A finished (or interrupted) run, loaded back: its trained plain model, its task and its config."""

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from ...tasks.protocol import ReportsEvaluation
from ...tasks.reward_tasks import HF
from ..setup.build import build, resolve_device
from ..setup.config import CUSTOM, TrainConfig, is_supervised
from ..setup.own_task import custom_label, resolve_for
from ..setup.old_runs import located, recorded, with_old_defaults
from . import rundir
from .checkpoint import find_checkpoint, load_checkpoint, load_weights, require_safetensors
from ...files import read_mapping


class Run(NamedTuple):
    """A finished run, loaded: the trained plain model, its task and its resolved configuration."""

    model: torch.nn.Module
    task: object
    config: TrainConfig



def read_config(directory: Path, task=None) -> TrainConfig:
    """A run directory's resolved config (``config.json``)."""
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a run directory ({_missing(directory)}); expected the --out of a run")
    if not os.path.lexists(config_path):
        raise ValueError(f"{directory} is not a run directory (no config.json){rundir.moved_aside(directory)}")
    # the model and the drift text, not found, are named below
    values = located(read_mapping(config_path), directory, optional=("model", "drift_text"))
    supervised = is_supervised(str(values.get("task")), task)
    try:
        cfg = TrainConfig.from_dict(with_old_defaults(values, supervised), source=str(config_path))
    except (ValueError, TypeError) as e:
        raise named(e, config_path) from e
    if cfg.task.startswith(CUSTOM) and task is None:
        raise ValueError(f"{directory} trained a task of your own ({cfg.task}); pass it (and its model unless the "
                         f"task makes it): load_run({str(directory)!r}, task=..., model=...) in Python, or nesgpu eval "
                         f"{directory} --task module:task [--model module:make_model]")
    if task is not None and cfg.task != custom_label(task):
        raise ValueError(f"{directory} trained task {cfg.task!r}; got a task named {custom_label(task)!r} (pass the "
                         f"task the run trained)")
    try:
        return resolve_for(cfg, task)
    except (ValueError, TypeError) as e:
        raise named(e, config_path) from e


def named(error: Exception, path: Path) -> Exception:
    """``error`` as it is where its message names ``path``; else the same kind of error, led by ``path``."""
    if str(path) in str(error):
        return error
    return (TypeError if isinstance(error, TypeError) else ValueError)(f"{path}: {error}")


def _missing(directory: Path) -> str:
    if directory.is_symlink() and not directory.exists():
        return f"a symbolic link to {os.readlink(directory)}, which does not exist or loops"
    return "it is a file" if directory.exists() else "it does not exist"


def load_run(directory: str | Path, device: str = "auto", model: nn.Module | None = None, task=None) -> Run:
    """The trained model of a run directory (``config.json`` + ``model.safetensors``; for a run that has not
    finished, its last checkpoint, with a warning), with its task and config, in one call. Weights that are
    not finite are refused. A run of your own model or task needs them again (``model=``, ``task=``): the
    config cannot rebuild them; the weights are loaded into ``model``. Calling it is your word that you trust
    the run: it imports the code config.json names (reward functions, a ``gym:module:Env-v0`` module), as
    ``nesgpu eval`` does only with ``--trust-run-code``; see ``nesgpu.tasks.user_code.named_code``.

    Example:
        >>> model, task, config = nesgpu.load_run("runs/digits")
        >>> task.evaluate(model)
    """
    require_safetensors()
    directory = Path(directory)
    cfg = read_config(directory, task)
    cfg.device = device
    _check_drift_text(cfg, directory)
    built = build(with_saved_source(cfg, directory), resolve_device(device), model=model, task=task,
                  log=lambda *a, **k: None)
    model = built.model
    if (directory / "model.safetensors").is_file():
        _check_saved_with(cfg, load_weights(model, directory / "model.safetensors"), directory)
    elif find_checkpoint(directory / "checkpoint") is not None:  # an interrupted or crashed run
        step = _step_of(load_checkpoint(directory / "checkpoint", model), directory / "checkpoint")
        warnings.warn(f"{directory} has not finished (no model.safetensors): using its last checkpoint, step {step}; "
                      f"continue it with nesgpu train --resume {directory}", stacklevel=2)
    else:
        raise ValueError(f"{directory} holds no weights yet (no model.safetensors, no checkpoint): the run stopped "
                         f"before its first checkpoint; train it again: nesgpu train --config "
                         f"{directory / 'config.json'} --out {directory} --overwrite{rundir.moved_aside(directory)}")
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{directory / 'model.safetensors'} holds non-finite values in {bad[:4]}; the run diverged")
    model.eval()
    return Run(model, built.task, cfg)


def _check_drift_text(cfg: TrainConfig, directory: Path) -> None:
    """A run whose evaluations measure drift on a text file (``drift_text``) needs the file again."""
    drift = cfg.option("drift_text")  # a task option (None where the task has none)
    if isinstance(drift, str) and not os.path.lexists(drift):
        raise ValueError(f"{directory / 'config.json'} names the drift text {drift} (--drift-text), which is gone: "
                         f"the run's evaluation measures drift_nll on it; restore the file, or set \"drift_text\" "
                         f"to null in {directory / 'config.json'} to evaluate without drift_nll")


def _step_of(state: dict, checkpoint: Path) -> int:
    """The step a checkpoint's state was written at; a ValueError where it records none that is one."""
    strategy = state.get("strategy")
    step = strategy.get("step") if isinstance(strategy, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"{checkpoint}: its state records step {step!r}; expected a whole number >= 0 (the file is "
                         f"damaged or not nesgpu's)")
    return step


def with_saved_source(cfg: TrainConfig, directory: Path) -> TrainConfig:
    """The config to rebuild a run's model from: a finished ``--model hf:DIR`` run whose source directory is
    gone is rebuilt from its own copy, ``RUN/hf`` (the fine-tuned model and its tokenizer), with a warning."""
    model = cfg.model or ""
    source = Path(model[len(HF):]).expanduser()
    if not model.startswith(HF) or (source / "config.json").is_file() or (source / "adapter_config.json").is_file():
        return cfg
    if not (directory / "hf" / "config.json").is_file():
        raise ValueError(f"{directory / 'config.json'} names --model {model}, the model the run started from, and "
                         f"{model[len(HF):]} holds none (no config.json); the run kept no copy ({directory / 'hf'} is "
                         f"written when it finishes): restore that model directory to load the run")
    warnings.warn(f"{model[len(HF):]} (the run's --model) is gone: rebuilding the model from the run's own copy, "
                  f"{directory / 'hf'}", stacklevel=3)
    return dataclasses.replace(cfg, model=HF + str(directory / "hf"))


def _check_saved_with(cfg: TrainConfig, metadata: dict, directory: Path) -> None:
    """The run that saved model.safetensors (its metadata) is the run config.json describes."""
    try:
        saved = json.loads(metadata["nesgpu_config"])
    except (KeyError, ValueError):
        return  # weights saved without nesgpu's metadata: only their names, shapes and dtypes can be checked
    saved = recorded(saved, directory, cfg.strategy, cfg.task)
    differ = rundir.differences(saved, cfg.to_dict(), rundir.defining())
    if differ:
        raise ValueError(f"{directory}: config.json does not describe the run that saved model.safetensors "
                         f"({'; '.join(differ)}, from the weights' own record to config.json); restore the run's "
                         f"config.json")


def evaluate_run(directory: str | Path, device: str = "auto", model: nn.Module | None = None, task=None) -> dict:
    """Rebuild a run's model from ``config.json`` and ``model.safetensors`` and evaluate it."""
    run = load_run(directory, device, model=model, task=task)
    value = run.task.evaluate(run.model)
    more = run.task.evaluation_info() if isinstance(run.task, ReportsEvaluation) else {}
    return {"task": run.config.task, "metric": run.task.metric, "value": value, **more, "run": str(directory)}


__all__ = ["Run", "evaluate_run", "load_run", "read_config"]
