"""The code a run directory names, imported only on the user's word: ``nesgpu eval``, ``play`` and ``train
--resume`` read the run's config.json first and refuse, before anything is imported, every module it names (a
``gym:module:Env-v0`` task's module, each reward function's module or file), installed or not, wherever it lies,
unless ``--trust-run-code`` is given (``--trust-reward-code``, its old name, still works). nesgpu's built-in
tasks and a plain ``gym:Env-v0`` name no code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..tasks.user_code import code_file, named_code
from ..train.setup.old_runs import located
from ..train.setup.paths import PATHS
from ..files import read_mapping

TRUST_FLAG = "--trust-run-code"


def add_trust_flag(parser, what: str) -> None:
    """``--trust-run-code`` on ``parser`` (and its old name, ``--trust-reward-code``, unlisted); ``what``: when."""
    parser.add_argument(TRUST_FLAG, dest="trust_run_code", action="store_true",
                        help=f"{what}import the code the run's config.json names (a gym:module:Env-v0 module, "
                             f"reward functions); read it first")
    parser.add_argument("--trust-reward-code", dest="trust_run_code", action="store_true", help=argparse.SUPPRESS)


def run_config(run: Path) -> dict | None:
    """The mapping in ``run``/config.json, read as data (a regular file, size and nesting limited); None where
    there is no config.json (the run's loading names that); a ValueError names a file that cannot be read."""
    path = run / "config.json"
    if not path.exists():
        return None
    return read_mapping(path)


def consent_to_run_code(run: Path, trusted: bool, command: str) -> None:
    """Refuse, in one line naming config.json, the module and the flag, a run whose config.json names code,
    unless ``trusted``; with it, say on stderr which file each name imports."""
    values = run_config(run) or {}
    # an older run's relative file.py: the file found from here (as the run's loading finds it), named as written
    named = zip(named_code(values), named_code(located(values, run, optional=PATHS)))
    for (what, _), (_, module) in named:
        file = code_file(module)
        imports = module if file is None else str(file) if module.endswith(".py") else f"{module} ({file})"
        if file is None and module.split(".")[0] not in (*sys.modules, *sys.builtin_module_names):
            imports += (" (not found from this directory: a module is imported from the working directory, so run "
                        "from where the run started)")
        if not trusted:
            raise ValueError(f"{run / 'config.json'} names {what}, which imports {imports}: a run directory can name "
                             f"any code, installed or not; read it, then pass {TRUST_FLAG} to import it")
        print(f"nesgpu {command}: importing {imports} for {what}", file=sys.stderr)


__all__ = ["TRUST_FLAG", "add_trust_flag", "consent_to_run_code", "run_config"]
