"""A user's own Python, named as ``module:name`` or ``path/file.py:name`` (a reward function, a task, a model)
or as a gymnasium id's module (``gym:module:Env-v0``): imported with the working directory searched first, as
``python`` run there would, for that import only (a ``tabulate.py`` there must not stand in for the installed
module torch imports later); the code a run's options name (:func:`named_code`), and the file such a name
would import, found without importing it, so that a run directory's names are shown (and consented to) before
any of its code runs.

A module imported this way must import its own helpers at its top level (or be a package that holds them): once
it is imported, the working directory is no longer on the import path."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path


def load_function(spec: str) -> Callable:
    """A function from ``module:name`` (importable, the current directory first) or ``path/file.py:name``; a
    ValueError says what is missing."""
    function = load_object(spec, "reward function", kind="function")
    if not callable(function):
        raise ValueError(f"reward function {spec!r}: {spec.rpartition(':')[0]} has no function "
                         f"{spec.rpartition(':')[2]!r} (it is a {type(function).__name__})")
    return function


def split_spec(spec: str, what: str, kind: str = "object") -> tuple[str, str]:
    """(module or file, name) of ``module:name`` or ``file.py:name``; a ValueError for anything else."""
    if not isinstance(spec, str):
        raise TypeError(f"a {what} is given as module:{kind} or file.py:{kind}; got {type(spec).__name__}")
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"a {what} is given as module:{kind} or file.py:{kind}; got {spec!r}")
    return module_name, name


def load_object(spec: str, what: str, kind: str = "object"):
    """The object ``module:name`` names (importable, the current directory first) or ``path/file.py:name``;
    ``what`` it is for (and the ``kind`` of object) name it in a ValueError that says what is missing."""
    module_name, name = split_spec(spec, what, kind)
    path = Path(module_name).expanduser()
    if module_name.endswith(".py") and not path.is_file():
        raise ValueError(f"{what} {spec!r}: no file {path}")
    if module_name.endswith(".py"):
        try:
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        except Exception as e:  # the user's module: its own error, in one line
            raise ValueError(f"{what} {spec!r}: cannot import {module_name!r} ({type(e).__name__}: {e})") from e
    else:
        module = import_module(module_name, f"{what} {spec!r}")
    if not hasattr(module, name):
        raise ValueError(f"{what} {spec!r}: {module_name} has no {kind} {name!r}")
    return getattr(module, name)


def import_module(module_name: str, what: str):
    """The module ``module_name``, imported with the working directory first on ``sys.path`` for this import
    only, then taken off again; a ValueError (naming ``what`` asked for it) says why it cannot be imported."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # the user's module: its own error, in one line
        raise ValueError(f"{what}: cannot import {module_name!r} ({type(e).__name__}: {e})") from e
    finally:
        if sys.path[:1] == [cwd]:
            del sys.path[0]
        else:  # the module itself moved it: take off the entry this import added
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def env_module(env_id: str) -> str | None:
    """The module a gymnasium id ``module:Env-v0`` has gymnasium import (to register the environment), or None
    for a plain ``Env-v0``."""
    module, sep, _ = env_id.rpartition(":")
    return module if sep else None


def named_code(values: Mapping) -> list[tuple[str, str]]:
    """The code a run's options (``values``: config.json's) name, as (what names it, the module or file it
    imports): a ``gym:module:Env-v0`` task's module and each reward function's. nesgpu's built-in tasks and a
    plain ``gym:Env-v0`` name none; a custom task or model is the caller's own object, not named here."""
    found = []
    task, reward = values.get("task"), values.get("reward")
    if isinstance(task, str) and task.startswith("gym:") and env_module(task[4:]) is not None:
        found.append((f"the task {task}", env_module(task[4:])))
    if reward is not None and not isinstance(reward, str):
        raise ValueError(f"reward: expected module:function names as text; got {type(reward).__name__}")
    for spec in [s.strip() for s in (reward or "").split(",") if s.strip()]:
        found.append((f"the reward function {spec}", spec.rpartition(":")[0] or spec))
    return found


def code_file(name: str) -> Path | None:
    """The file a module name or ``file.py`` would import first (a package's ``__init__.py``), found without
    running anything, the working directory first; None for a module that is not a file (built into Python), is
    not found, or whose package this process has imported already (nesgpu's own, torch: code that runs anyway)."""
    if name.endswith(".py"):
        return Path(name).expanduser().resolve()
    top = name.split(".")[0]
    if top in sys.modules:
        return None
    spec_found = importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path])
    if spec_found is None or not spec_found.has_location or not spec_found.origin:
        return None
    return Path(spec_found.origin).resolve()


__all__ = ["code_file", "env_module", "import_module", "load_function", "load_object", "named_code", "split_spec"]
