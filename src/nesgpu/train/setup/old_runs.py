"""Run directories and checkpoints written by an older nesgpu, read as this version reads its own: the one place
that knows what an older run meant. Each function takes what a run recorded and returns what a run of this
version would have recorded; a current run's files pass through unchanged.

- **Options it did not record** (newer than the run) take the values its nesgpu used (:data:`OLD_DEFAULTS`).
- **Relative paths.** A current run records the paths its options name as absolute ones
  (:mod:`nesgpu.train.setup.paths`); an older one recorded them as given. Such a path is looked for in the
  working directory, then in the directory the run started in where its relative ``out`` tells it (``out``
  ``runs/a`` of ``/work/runs/a``: ``/work``), then in the run directory's parent.
- **Every option.** An older run recorded every strategy's and task's options; the ones its own strategy and
  task do not take are dropped.
- **Checkpoints.** An older checkpoint kept the step sizes in a torch LR scheduler's ``base_lrs`` (and
  ``initial_lr`` in the optimizer's groups), and recorded no fingerprint of its data.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Collection
from pathlib import Path

from .component_options import BACKPROP, own_only
from .paths import PATHS, each_path, full_path

# the values of options newer than a run (its config.json lacks them) that its nesgpu used: every run had float
# weights in the model's own dtype; RL policies were squashed by tanh and their standardised observations
# clipped at 5, rollouts shared start states, unshifted; the strategy's optimizer stepped .grad
OLD_DEFAULTS = {"bits": None, "noise_on": "latent", "act_bits": None, "dtype": None, "init": "default",
                "evolve": "all", "update": "strategy"}
OLD_RL_DEFAULTS = {"policy_output": "tanh", "observation_clip": 5.0, "start_states": "shared", "reward_shift": 0.0}


def with_old_defaults(values: dict, supervised: bool) -> dict:
    """``values`` (a run's recorded options) with the options it did not record at the values its nesgpu used."""
    return {**OLD_DEFAULTS, **({} if supervised else OLD_RL_DEFAULTS), **values}


def recorded(values: dict, run: Path, strategy: str, task: str, supervised: bool | None = None) -> dict:
    """A run's recorded options as this version reads them: its paths :func:`located` (each optional: the
    caller names what is missing), the options it did not record at their old values (where ``supervised`` is
    given: which defaults the run had), and only the options ``strategy`` and ``task`` take."""
    values = located(values, run, optional=PATHS)
    if supervised is not None:
        values = with_old_defaults(values, supervised)
    return own_only(values, strategy, task)


def resumed(values: dict, run: Path, optional: Collection[str]) -> dict:
    """The options of the run ``--resume`` continues, as the command line starts from: its paths
    :func:`located` (those in ``optional``, which the command line replaces, need not be found), and an ES run
    from before ``--update`` stepping .grad by its strategy's optimizer, as it did."""
    values = located(values, run, optional=optional)
    if "update" not in values and values.get("strategy") != BACKPROP:
        values["update"] = "strategy"
    return values


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
    """A run's recorded ``values`` with each relative path replaced by the first of :func:`_bases` where it
    exists. One found nowhere is a ValueError naming the places tried, unless its option is ``optional`` (it is
    then kept as given: the caller says what is missing)."""
    bases = _bases(values, run)

    def find(name: str, values: dict) -> Callable[[str], str]:
        def where(path: str) -> str:
            if Path(path).expanduser().is_absolute():
                return path
            tried = [full_path(path, base) for base in bases]
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

    return each_path(values, find)


def saved_step_sizes(state: dict, optimizer) -> list | float | None:
    """The step sizes an ES checkpoint's strategy state saved (``lr``; an older one: its LR scheduler's
    ``base_lrs``; None: neither), with the ``initial_lr`` such a scheduler left in ``optimizer``'s groups
    (loaded from the same state) removed."""
    for group in optimizer.param_groups:
        group.pop("initial_lr", None)
    if "lr" in state:
        return state["lr"]
    return state.get("lr_scheduler", {}).get("base_lrs")


def warn_unfingerprinted(task, out: Path) -> None:
    """An older checkpoint records no fingerprint of its data; its nesgpu dropped repeated prompts, which this
    one draws from: a warning where the prompts repeat rows."""
    prompts = getattr(task, "prompts", None)
    if isinstance(prompts, list) and len(set(prompts)) < len(prompts):
        warnings.warn(f"resuming {out}: its checkpoint records no fingerprint of its data, and the prompts "
                      f"repeat rows ({len(prompts)} rows, {len(set(prompts))} distinct), which the nesgpu that "
                      f"wrote it dropped: the steps from here draw from all {len(prompts)}", stacklevel=3)


__all__ = ["OLD_DEFAULTS", "OLD_RL_DEFAULTS", "located", "recorded", "resumed", "saved_step_sizes",
           "warn_unfingerprinted", "with_old_defaults"]
