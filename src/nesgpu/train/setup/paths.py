"""The files and directories a run's options name (``--model hf:DIR``, ``--prompts``, ``--eval-prompts``,
``--drift-text``, a reward given as ``file.py:function``, ``--out``): a run records them as absolute paths,
resolved against the working directory it started in, so that ``--resume``, ``eval`` and ``play`` work from
any directory (an older run's relative paths are found by :mod:`nesgpu.train.setup.old_runs`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ...tasks.reward_tasks import HF
from .config import TrainConfig

# the options that name files, beside ``model`` (hf:DIR), ``reward`` (file.py:function) and ``out``
FILES = ("prompts", "eval_prompts", "drift_text")
PATHS = ("model", "reward", *FILES)


def full_path(path: str, base: Path) -> str:
    return os.path.normpath(base / Path(path).expanduser())


def mapped(values: dict, name: str, where: Callable[[str], str]) -> str | None:
    """Option ``name``'s value with each path it names passed through ``where`` (None: it names none)."""
    value = values.get(name)
    if not isinstance(value, str) or not value:
        return None
    if name == "model":
        return HF + where(value[len(HF):]) if value.startswith(HF) and value != HF else None
    if name == "reward":
        specs = [spec.strip() for spec in value.split(",")]
        return ",".join(where(module) + ":" + function if module.endswith(".py") else spec
                        for spec, (module, _, function) in ((s, s.rpartition(":")) for s in specs))
    return where(value)


def each_path(values: dict, where: Callable[[str, dict], Callable[[str], str]]) -> dict:
    """A config mapping with each path its options name (a task's under ``task_options`` too) passed through
    ``where(name, mapping)``."""
    found = {name: mapped(values, name, where(name, values)) for name in PATHS}
    nested = values.get("task_options")
    if isinstance(nested, dict):
        found["task_options"] = each_path(nested, where)
    return {**values, **{name: value for name, value in found.items() if value is not None}}


def absolute(values: dict, base: Path) -> dict:
    """``values`` (a run's options) with every path they name made absolute against ``base``."""
    values = each_path(values, lambda name, mapping: lambda path: full_path(path, base))
    if isinstance(values.get("out"), str):
        values["out"] = full_path(values["out"], base)
    return values


def with_absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` (resolved) with the paths its options name made absolute against the working directory: what a
    new run records in config.json."""
    values = cfg.to_dict()
    changed = {name: value for name, value in absolute(values, Path.cwd()).items() if value != values[name]}
    return cfg.with_options(**changed)


__all__ = ["PATHS", "absolute", "each_path", "full_path", "mapped", "with_absolute_paths"]
