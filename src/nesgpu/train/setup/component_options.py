"""The options the training configuration takes from its components: the chosen strategy's ``Options``
(backprop's too) and the chosen task's. A configuration holds them as two objects, ``strategy_options`` and
``task_options``, built when it is resolved.

Config files, config.json and keyword arguments may name them flat (``top_b: 2``,
``TrainConfig.flat(episodes=3)``): :func:`route` sends a flat name to the side whose components declare it.
A strategy and a task may declare the same name. Such a name is routed to whichever of the chosen strategy
and task takes it. If both take it, it must be given under its side, as ``strategy_options: {name: ...}`` or
``task_options: {name: ...}`` (flags ``--strategy-NAME`` / ``--task-NAME``), and :func:`joined` writes it so.

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
# where a config mapping holds each side's options
KEYS = {"strategy": "strategy_options", "task": "task_options"}


def sides(name: str) -> list[Owners]:
    """The sides (STRATEGY, TASK, both or neither) whose components declare option ``name``."""
    return [owners for owners in (STRATEGY, TASK) if owners.owners(name)]


def route(name: str, strategy: str | None, task: str | None, source: str = "config",
          unclaimed: str = "error") -> Owners | None:
    """The side of option ``name`` given flat in a run of ``strategy`` and ``task`` (their names; None: no
    such component): the one side that declares it, else the side of the chosen component that takes it (None:
    a run option, or no option). A name both chosen components take is a ValueError; one that neither takes is
    a ValueError too, or, with ``unclaimed="drop"``, routed nowhere (None; an older run recorded every option)."""
    declared = sides(name)
    if len(declared) < 2:
        return declared[0] if declared else None
    takes = [owners for owners, owner in ((STRATEGY, strategy), (TASK, task_key(task or "")))
             if name in owners.defaults_of(owner)]
    if len(takes) == 1:
        return takes[0]
    flag = name.replace("_", "-")
    if takes:
        raise ValueError(f"{source}: option {name!r} is an option of strategy {strategy!r} and of task {task!r}: give "
                         f"it under its side, in strategy_options or task_options (flags --strategy-{flag} / "
                         f"--task-{flag})")
    if unclaimed == "drop":
        return None
    raise ValueError(f"{source}: option {name!r} applies to strategy {' or '.join(STRATEGY.owners(name))} or task "
                     f"{' or '.join(TASK.owners(name))}, not to strategy {strategy!r} nor task {task!r}; drop it")


def split(given: dict, strategy: str | None, task: str | None, source: str = "config",
          unclaimed: str = "error") -> tuple[dict, dict, dict]:
    """A config mapping (options by name, and ``strategy_options`` / ``task_options`` mappings) as three: the
    run's options (and names that are no option), the strategy's and the task's. Flat names go by :func:`route`.
    A mapping entry of the wrong side, or a name given flat and in its side's mapping with another value, is a
    ValueError. ``unclaimed``: as :func:`route` takes it (``"drop"``: such a name is left out)."""
    parts: tuple[dict, dict] = ({}, {})
    for owners, part in zip((STRATEGY, TASK), parts):
        key, nested = KEYS[owners.kind], given.get(KEYS[owners.kind])
        if nested is None:
            continue
        if dataclasses.is_dataclass(nested) and not isinstance(nested, type):
            nested = values(nested)
        if not isinstance(nested, dict):
            raise ValueError(f"{source}: {key} must be a mapping of the {owners.kind}'s options; got {nested!r:.60}")
        wrong = [name for name in nested if not owners.owners(name)]
        if wrong:
            raise ValueError(f"{source}: {key} names {wrong[0]!r}, which is no {owners.kind}'s option; expected some "
                             f"of {owners.names()}")
        part.update(nested)
    run = {}
    for name, value in given.items():
        owners = None if name in KEYS.values() else route(name, strategy, task, source, unclaimed)
        if owners is None:
            if name not in KEYS.values() and not sides(name):
                run[name] = value
            continue
        part = parts[owners is TASK]
        if name in part and part[name] != value:
            raise ValueError(f"{source}: option {name!r} is given twice, as {value!r} and in {KEYS[owners.kind]} as "
                             f"{part[name]!r}")
        part[name] = value
    return run, parts[0], parts[1]


def joined(run: dict, strategy: dict, task: dict) -> dict:
    """The mapping config files and config.json hold: the run's options, then the strategy's and the task's by
    name, except a name a strategy and a task both declare, which goes under its side (``strategy_options``,
    ``task_options``)."""
    out = dict(run)
    for key, part in ((KEYS["strategy"], strategy), (KEYS["task"], task)):
        for name, value in part.items():
            if len(sides(name)) > 1:
                out.setdefault(key, {})[name] = value
            else:
                out[name] = value
    return out


def keyed(given: dict) -> dict:
    """A config mapping with one key per option: a side's mapping's entries as ``strategy_options.NAME``."""
    flat = {k: v for k, v in given.items() if k not in KEYS.values()}
    for key in KEYS.values():
        flat.update({f"{key}.{name}": value for name, value in (given.get(key) or {}).items()})
    return flat


def check_option_type(owners: Owners, name: str, value, source: str) -> None:
    """``value`` fits option ``name``'s type as some component of ``owners``' side declares it, or is None:
    unset, the owner's default (the owner's Options check the rest when the config is resolved)."""
    if value is None:
        return
    fields = [f for options in owners.registry.values() for f in dataclasses.fields(options) if f.name == name]
    errors = []
    for f in fields:
        try:
            return check_type(name, value, f.type, source)
        except ValueError as e:
            errors.append(e)
    raise errors[0]


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
    if isinstance(options, dict) or named:
        wrong = sorted(name for name in [*(options if isinstance(options, dict) else ()), *named]
                       if not owners.owners(name))
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


def own_only(given: dict, strategy: str, task: str) -> dict:
    """A config mapping without the options neither ``strategy`` nor ``task`` takes."""
    run, mine, theirs = split(given, strategy, task, unclaimed="drop")
    return joined(run, STRATEGY.own_only(mine, strategy), TASK.own_only(theirs, task_key(task)))


__all__ = ["BACKPROP", "KEYS", "STRATEGY", "TASK", "Owners", "as_values", "check_option_type", "defining_options",
           "joined", "keyed", "own_only", "read", "route", "sides", "split", "task_key", "with_named"]
