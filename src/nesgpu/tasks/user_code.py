"""A user's own Python, named as ``module:name`` or ``path/file.py:name`` (a reward function, a task, a model):
imported with the working directory searched first, as ``python`` run there would, without leaving it on the
import path for everything imported after; and the file such a name would import, found without importing
it, so that a run directory's names can be shown (and consented to) before any of its code runs."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable
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
    try:
        if module_name.endswith(".py"):
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            with _working_directory_first():
                module = importlib.import_module(module_name)
    except Exception as e:  # the user's module: its own error, in one line
        raise ValueError(f"{what} {spec!r}: cannot import {module_name!r} ({type(e).__name__}: {e})") from e
    if not hasattr(module, name):
        raise ValueError(f"{what} {spec!r}: {module_name} has no {kind} {name!r}")
    return getattr(module, name)


@contextlib.contextmanager
def _working_directory_first():
    """The working directory first on ``sys.path`` for one import, then last: a file there named like an
    installed module imported later (``tabulate.py``) must not stand in for it, while a module next to the
    user's (``import helpers`` inside a reward function) is still found when the function runs."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # the module itself may have taken it off
            sys.path.remove(cwd)
        if cwd not in sys.path:
            sys.path.append(cwd)


def code_file(spec: str) -> Path | None:
    """The file ``module:name`` or ``file.py:name`` would import first (a package's ``__init__.py``), found
    without running anything; None for a module that is not a file (built into Python), is not found, or
    whose package this process has imported already (nesgpu's own, torch: code that runs anyway)."""
    module_name, _ = split_spec(spec, "reward function", "function")
    if module_name.endswith(".py"):
        return Path(module_name).expanduser().resolve()
    top = module_name.split(".")[0]
    if top in sys.modules:
        return None
    spec_found = importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path])
    if spec_found is None or not spec_found.has_location or not spec_found.origin:
        return None
    return Path(spec_found.origin).resolve()


def installed(file: Path) -> bool:
    """Whether ``file`` is installed Python: the standard library's or site-packages' (code the user installed)."""
    paths = sysconfig.get_paths()
    return not outside(file, *{paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths})


def outside(file: Path, *directories: Path) -> bool:
    """Whether ``file`` lies in none of ``directories``."""
    return not any(file.is_relative_to(Path(d).resolve()) for d in directories)


__all__ = ["code_file", "installed", "load_function", "load_object", "outside", "split_spec"]
