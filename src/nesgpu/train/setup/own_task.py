"""A run of a task of your own (``train(cfg, task=...)``): the config it records (labelled ``custom:<name>``)
and the task's own ``defaults`` mapping, set where the config leaves an option unset."""

from __future__ import annotations

import dataclasses

from .component_options import STRATEGY, TASK, sides
from .config import TrainConfig
from .defaults import BACKPROP, CUSTOM, ES_ONLY, GLOBAL_DEFAULTS


def custom_label(task) -> str:
    """The task name a run of the user's own ``task`` records: ``custom:<its name or class name>``."""
    return f"{CUSTOM}{getattr(task, 'name', None) or type(task).__name__}"


def labelled(cfg: TrainConfig, task) -> TrainConfig:
    """``cfg`` for a run of the user's own ``task`` object: labelled ``custom:<its name>`` (unless it is
    already) and with the task's ``defaults`` mapping, if it has one, in the options left unset (None)."""
    name = getattr(task, "name", None) or type(task).__name__
    label = cfg.task if cfg.task.startswith(CUSTOM) else custom_label(task)
    defaults = getattr(task, "defaults", None) or {}
    if not isinstance(defaults, dict):
        raise TypeError(f"a task's defaults must be a dict of TrainConfig options; got {type(defaults).__name__}")
    fields = {f.name for f in dataclasses.fields(TrainConfig) if not f.metadata.get("component")}
    unknown = sorted(name for name in defaults if name not in fields and not sides(name))
    if unknown:
        raise ValueError(f"task {name!r}: defaults {unknown} are not TrainConfig options")
    # the other side's defaults do not apply to it, nor other strategies' options
    strategy = cfg.strategy or defaults.get("strategy") or GLOBAL_DEFAULTS["strategy"]
    skip = set(STRATEGY.names()) - set(STRATEGY.defaults_of(strategy)) | (set(ES_ONLY) if strategy == BACKPROP
                                                                           else set())
    wrong = sorted(name for name in defaults if sides(name) == [TASK])
    if wrong:  # a task of your own owns no built-in task's options: it reads none of them
        raise ValueError(f"task {name!r}: defaults {wrong} are options of the built-in tasks, which train() does not "
                         f"pass to a task of your own; set them in your task")
    unset = {k: v for k, v in defaults.items() if cfg.option(k) is None and k not in skip}
    return cfg.with_options(task=label, **unset)


def resolve_for(cfg: TrainConfig, task=None) -> TrainConfig:
    """``cfg`` resolved for a run of ``task``: a built-in one by its name (None), or the user's own object
    (see :func:`labelled`)."""
    if task is None:
        if cfg.task.startswith(CUSTOM):
            raise ValueError(f"task {cfg.task!r} is a task of your own: pass the object (train(cfg, task=...), "
                             f"load_run(directory, task=...)); the config cannot rebuild it")
        return cfg.resolved()
    return labelled(cfg, task).resolved()


__all__ = ["custom_label", "labelled", "resolve_for"]
