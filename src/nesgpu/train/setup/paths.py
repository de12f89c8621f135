"""The files and directories a run's options name (``--model hf:DIR``, ``--prompts``, ``--eval-prompts``,
``--drift-text``, a reward given as ``file.py:function``, ``--out``): a run records them as absolute paths,
resolved against the working directory it started in, so that ``--resume``, ``eval`` and ``play`` work from
any directory. A run written before this recorded them as given; such a relative path is looked for in the
working directory, then in the directory the run started in where its relative ``out`` tells it (``out``
``runs/a`` of ``/work/runs/a``: ``/work``), then in the run directory's parent."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection
from pathlib import Path

from ...tasks.reward_tasks import HF
from .config import TrainConfig

# the options that name files, beside ``model`` (hf:DIR), ``reward`` (file.py:function) and ``out``
FILES = ("prompts", "eval_prompts", "drift_text")
PATHS = ("model", "reward", *FILES)


def _full(path: str, base: Path) -> str:
    return os.path.normpath(base / Path(path).expanduser())


def _mapped(values: dict, name: str, where: Callable[[str], str]) -> str | None:
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


def absolute(values: dict, base: Path) -> dict:
    """``values`` (a run's options, by name) with every path they name made absolute against ``base``."""
    found = {name: _mapped(values, name, lambda path: _full(path, base)) for name in PATHS}
    if isinstance(values.get("out"), str):
        found["out"] = _full(values["out"], base)
    return {**values, **{name: value for name, value in found.items() if value is not None}}


def with_absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` (resolved) with the paths its options name made absolute against the working directory: what a
    new run records in config.json."""
    values = cfg.to_dict()
    changed = {name: value for name, value in absolute(values, Path.cwd()).items() if value != values[name]}
    cfg = dataclasses.replace(cfg)
    for name, value in changed.items():
        setattr(cfg, name, value)
    return cfg


def _bases(values: dict, run: Path) -> list[Path]:
    """Where a run's relative paths may start: the working directory, the directory the run started in (where its
    relative ``out`` ends the run directory's path), the run directory's parent."""
    here = Path(os.path.abspath(run))
    bases = [Path.cwd()]
    out = values.get("out")
    parts = Path(out).parts if isinstance(out, str) and out and not Path(out).is_absolute() else ()
    if parts and ".." not in parts and here.parts[-len(parts):] == parts and len(here.parts) > len(parts):
        bases.append(Path(*here.parts[:-len(parts)]))
    bases.append(here.parent)
    return list(dict.fromkeys(bases))


def located(values: dict, run: Path, optional: Collection[str] = ()) -> dict:
    """A run's recorded ``values`` with each relative path (a run of an older nesgpu) replaced by the first of
    :func:`_bases` where it exists. One found nowhere is a ValueError naming the places tried, unless its option
    is ``optional`` (it is then kept as given: the caller says what is missing)."""
    bases = _bases(values, run)

    def find(name: str) -> Callable[[str], str]:
        def where(path: str) -> str:
            if Path(path).expanduser().is_absolute():
                return path
            tried = [_full(path, base) for base in bases]
            for full in tried:
                if os.path.exists(full):
                    return full
            if name in optional:
                return path
            raise ValueError(f"{run / 'config.json'} names {name} {values[name]!r}: {path} is relative to the "
                             f"directory the run started in, which older runs did not record, and is not at "
                             f"{' nor '.join(dict.fromkeys(tried))}; run this from that directory, or write the path "
                             f"in full in {run / 'config.json'}")
        return where

    found = {name: _mapped(values, name, find(name)) for name in PATHS}
    return {**values, **{name: value for name, value in found.items() if value is not None}}


__all__ = ["PATHS", "absolute", "located", "with_absolute_paths"]
