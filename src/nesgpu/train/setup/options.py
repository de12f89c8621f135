"""The options the training configuration takes from its components. Every field of a strategy's
``Options`` (backprop's too) and of a built-in task's becomes a flat option of the configuration, of the CLI
(``--top-b``, ``--episodes``) and of config files (``top_b:``), owned by the components that declare it; its
default there is None, "the owner's own". A resolved configuration holds the values of its strategy's and its
task's options and None for every other's; one set under another owner is an error that names its owners.

Adding a strategy or a task with options of its own touches nothing here: its ``Options`` are read from the
registries (``nesgpu.strategies.STRATEGIES``, ``nesgpu.tasks.TASKS``).
"""

from __future__ import annotations

from ...options import Owners
from ...strategies import STRATEGIES
from ...tasks import TASK_OPTIONS, TASKS
from ..steps.backprop import BackpropOptions

# the gradient baseline: not an ES strategy (no population, no noise) but a strategy name of the config
BACKPROP = "backprop"


# every strategy's options, by the strategy's config name; every built-in task's, by its registry key
STRATEGY = Owners("strategy", {**{name: cls.Options for name, cls in STRATEGIES.items()}, BACKPROP: BackpropOptions})
TASK = TASK_OPTIONS


def task_key(task: str) -> str | None:
    """The registry key that owns a task name's options ("gym" for gym:<id>; None for a task of your own)."""
    if task.startswith("gym:"):
        return "gym"
    return task if task in TASKS else None


def own_only(values: dict, strategy: str, task: str) -> dict:
    """``values`` with the options neither ``strategy`` nor ``task`` takes set to None."""
    return TASK.own_only(STRATEGY.own_only(values, strategy), task_key(task))


__all__ = ["BACKPROP", "STRATEGY", "TASK", "Owners", "own_only", "task_key"]
