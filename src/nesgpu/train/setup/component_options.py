"""The options the training configuration takes from its components: the chosen strategy's ``Options``
(backprop's too) and the chosen task's. A configuration holds them as two objects, ``strategy_options`` and
``task_options``, built when it is resolved; config files, config.json and keyword arguments name them flat
(``top_b: 2``, ``TrainConfig.flat(episodes=3)``), and :func:`side` says which of the two a name belongs to. One
set under another owner is an error that names its owners.

Adding a strategy or a task with options of its own touches nothing here: its ``Options`` are read from the
registries (``nesgpu.strategies.STRATEGIES``, ``nesgpu.tasks.TASKS``) at each call.
"""

from __future__ import annotations

import dataclasses

from ...options import Owners, check_type, values
from ...strategies import STRATEGIES
from ...tasks import TASK_OPTIONS, task_key
from ..steps.backprop import BackpropOptions

# the gradient baseline: not an ES strategy (no population, no noise) but a strategy name of the config
BACKPROP = "backprop"

# every strategy's options, by the strategy's config name; every built-in task's, by its registry key
STRATEGY = Owners("strategy", lambda: {**STRATEGIES.options_by_name(), BACKPROP: BackpropOptions})
TASK = TASK_OPTIONS


def side(name: str) -> Owners | None:
    """The owners (STRATEGY or TASK) of option ``name``; None when no component declares it. A name declared
    by a strategy and by a task could not be told apart in a config file: a TypeError."""
    sides = [owners for owners in (STRATEGY, TASK) if owners.owners(name)]
    if len(sides) > 1:
        raise TypeError(f"option {name!r} is declared by strategy {STRATEGY.owners(name)} and by task "
                        f"{TASK.owners(name)}; rename one")
    return sides[0] if sides else None


def check_option_type(name: str, value, source: str) -> None:
    """``value`` fits a component option's type as some owner declares it, or is None: unset, the owner's
    default (the owner's Options check the rest when the config is resolved)."""
    if value is None:
        return
    fields = [f for options in side(name).registry.values() for f in dataclasses.fields(options)
              if f.name == name]
    errors = []
    for f in fields:
        try:
            return check_type(name, value, f.type, source)
        except ValueError as e:
            errors.append(e)
    raise errors[0]


def by_side(named: dict, where: str = "TrainConfig") -> tuple[dict, dict]:
    """Options given flat (``top_b=2, episodes=3``), split into the strategy's and the task's; a name no
    component declares is a TypeError."""
    sides: tuple[dict, dict] = ({}, {})
    for name, value in named.items():
        owners = side(name)
        if owners is None:
            raise TypeError(f"{where} got an unknown option {name!r}; expected a run option or an option of a "
                            f"strategy ({', '.join(STRATEGY.names())}) or a task ({', '.join(TASK.names())})")
        sides[owners is TASK][name] = value
    return sides


def as_values(options) -> dict:
    """A component's options by name, whether given as a mapping or built (an Options object)."""
    if options is None:
        return {}
    if isinstance(options, dict):
        return dict(options)
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        return values(options)
    raise TypeError(f"component options must be a dict of options or an Options object; got "
                    f"{type(options).__name__}")


def with_named(options, named: dict, owners: Owners):
    """``options`` of ``owners``' side (a dict of given values, an Options object, or None) with the ``named``
    values set: an Options object that takes them all stays one (checked again), else a dict, from which the
    config is resolved. A key of the dict that is not an option of that side is a TypeError. (An Options
    object is taken whole: each of its fields is a given value, its defaults included.)"""
    if isinstance(options, dict):
        wrong = sorted(name for name in options if side(name) is not owners)
        if wrong:
            raise TypeError(f"{owners.kind}_options: {wrong} are not options of a {owners.kind}; expected some of "
                            f"{owners.names()}")
    if not named and options is not None:
        return options
    if dataclasses.is_dataclass(options) and set(named) <= set(values(options)):
        return dataclasses.replace(options, **named)
    return {**as_values(options), **named}


def read(options, name: str):
    """Option ``name`` of a config's strategy or task options (None: not set, or not the component's)."""
    if isinstance(options, dict):
        return options.get(name)
    return getattr(options, name, None)


def defining_options() -> list[str]:
    """The strategies' and tasks' options that define a run (``option(..., defines=True)``), by name."""
    return list(dict.fromkeys(f.name for owners in (STRATEGY, TASK) for options in owners.registry.values()
                              for f in dataclasses.fields(options) if f.metadata.get("defines")))


def own_only(values: dict, strategy: str, task: str) -> dict:
    """``values`` without the options neither ``strategy`` nor ``task`` takes."""
    return TASK.own_only(STRATEGY.own_only(values, strategy), task_key(task))


__all__ = ["BACKPROP", "STRATEGY", "TASK", "Owners", "as_values", "by_side", "check_option_type", "defining_options",
           "own_only", "read",
           "side", "task_key", "with_named"]
