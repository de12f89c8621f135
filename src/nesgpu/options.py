"""Options of a component (a strategy, a task): a frozen dataclass whose fields carry a one-line doc, their
choices and their lower bound, checked once when it is built. The training configuration holds the chosen
strategy's and task's as objects of their own; config files and the CLI name each option flat (``top_b:`` in
YAML, ``--top-b`` under ``--strategy ars``), and :class:`Owners` (the components of one kind, read from their
registry at each call) says whose it is (see :mod:`nesgpu.train.setup.component_options`).

A strategy's options, as ARS declares them::

    @dataclass(frozen=True)
    class ARSOptions:
        top_b: int | None = option(None, "directions used per step (default: all)", at_least=1)
        ars_version: str = option("v2", "v1 (raw observations) or v2", choices=("v1", "v2"), arg="version")

        def __post_init__(self):
            check_options(self, "ars")
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping


def option(default, help: str, *, choices: tuple | None = None, at_least: float | None = None,
           above: float | None = None, at_most: float | None = None, arg: str | None = None,
           defines: bool = False):
    """A field of an options dataclass: its default and doc; ``choices`` and bounds (``at_least``, or
    ``above`` for a strict minimum; ``at_most``) that :func:`check_options` enforces; ``arg``, the name of
    the constructor argument it sets when that differs from the option's name; and ``defines``: whether it
    defines a run (a resume that changes it is refused: the checkpoint would be another run's)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "at_least": at_least,
                                                        "above": above, "at_most": at_most, "arg": arg,
                                                        "defines": defines})


def annotation_text(annotation) -> str:
    """A field's annotation as text ("int | None"), whether the module postponed its annotations or not."""
    if isinstance(annotation, str):
        return annotation
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("NoneType", "None")


def check_type(name: str, value, annotation, source: str) -> None:
    """``value`` fits the field's annotation (a string: these modules use postponed annotations). YAML and
    JSON give bools, ints, floats, strings, lists and mappings; "no" is a string, not False, and 3.7 is not an
    int."""
    allowed = [a.strip() for a in annotation_text(annotation).split("|")]
    if value is None and "None" in allowed:
        return
    checks = {
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "dict": lambda v: isinstance(v, dict),
        "tuple[int, ...]": lambda v: isinstance(v, (list, tuple)) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v),
    }
    if not any(checks[a](value) for a in allowed if a in checks):
        raise ValueError(f"{source}: option {name!r} must be {' or '.join(allowed)}; got {value!r} "
                         f"({type(value).__name__})")


def check_options(options, owner: str) -> None:
    """Every field of ``options`` against its annotation, choices and bounds; a ValueError names the owner,
    the option, the value and what was expected."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        check_type(f.name, value, f.type, owner)
        if value is None:
            continue
        meta = f.metadata
        if meta.get("choices") and value not in meta["choices"]:
            raise ValueError(f"{owner}: option {f.name!r} must be one of {list(meta['choices'])}; got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}: option {f.name!r} must be finite; got {value}")
        if meta.get("at_least") is not None and value < meta["at_least"]:
            raise ValueError(f"{owner}: option {f.name!r} must be >= {meta['at_least']}; got {value}")
        if meta.get("above") is not None and value <= meta["above"]:
            raise ValueError(f"{owner}: option {f.name!r} must be > {meta['above']}; got {value}")
        if meta.get("at_most") is not None and value > meta["at_most"]:
            raise ValueError(f"{owner}: option {f.name!r} must be <= {meta['at_most']}; got {value}")


def arguments(options) -> dict:
    """The constructor arguments ``options`` sets, by each field's ``arg`` name (default: its own)."""
    return {f.metadata.get("arg") or f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def values(options) -> dict:
    """Every option by its name."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a component that has none."""


@dataclasses.dataclass(frozen=True)
class Owners:
    """The components of one kind ("strategy", "task") and their Options, by the name the config uses.
    ``components`` reads the registry at each call, so a component registered after import is known."""

    kind: str
    components: Callable[[], Mapping[str, type]]
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # how an owner is named ("gym:<id>")

    @property
    def registry(self) -> Mapping[str, type]:
        """Every component's Options, by its name."""
        return self.components()

    def label(self, owner: str) -> str:
        return self.labels.get(owner, owner)

    def owners(self, name: str) -> list[str]:
        """The components whose options include ``name``."""
        return [o for o, options in self.registry.items() if name in {f.name for f in dataclasses.fields(options)}]

    def names(self) -> list[str]:
        """Every option's name, once, in the registry's order."""
        return list(dict.fromkeys(f.name for options in self.registry.values() for f in dataclasses.fields(options)))

    def field(self, name: str) -> dataclasses.Field | None:
        """The first declaration of option ``name`` (None: no component declares it)."""
        return next((f for options in self.registry.values() for f in dataclasses.fields(options)
                     if f.name == name), None)

    def defaults_of(self, owner: str | None) -> dict:
        """The options of ``owner`` at their defaults (an unknown one, or None: none)."""
        options = self.registry.get(owner)
        return values(options()) if options is not None else {}

    def options_of(self, owner: str, values: dict):
        """``owner``'s Options built from the config ``values`` of them (None: the default), checked by the
        Options themselves."""
        options = self.registry[owner]
        return options(**{f.name: values[f.name] for f in dataclasses.fields(options)
                          if values.get(f.name) is not None})

    def refusal(self, name: str, value, owner: str | None, hint: str = "") -> ValueError:
        """The error of option ``name`` set to ``value`` under ``owner``, which does not take it."""
        theirs = [self.label(o) for o in self.owners(name)]
        mine = f"{self.kind} {self.label(owner)!r}" if owner else f"a {self.kind} of your own"
        fix = f" or choose --{self.kind} {theirs[0]}" if self.kind == "strategy" else ""
        return ValueError(f"option {name!r} (= {value!r}) applies to {self.kind} {' or '.join(map(repr, theirs))}, "
                          f"not to {mine}{hint}; drop it{fix}")

    def drop_foreign(self, values: dict, owner: str | None, allowed: Mapping | None = None) -> None:
        """Drop, from ``values``, the options ``owner`` does not take. One that holds anything but None, an
        owner's default or ``allowed``'s value (older run directories recorded every option) is an error: an
        option that does not apply is never silently ignored."""
        own, allowed = self.defaults_of(owner), allowed or {}
        for name in self.names():
            value = values.get(name)
            if name in own or name not in values:
                continue
            known = [self.defaults_of(o)[name] for o in self.owners(name)]
            known += [allowed[name]] if name in allowed else []
            if value is not None and value not in known:
                raise self.refusal(name, value, owner)
            del values[name]

    def own_only(self, values: dict, owner: str | None) -> dict:
        """A copy of ``values`` without the options ``owner`` does not take (older run directories recorded
        them all)."""
        own = self.defaults_of(owner)
        return {k: v for k, v in values.items() if k in own or k not in set(self.names())}


__all__ = ["NoOptions", "Owners", "annotation_text", "arguments", "check_options", "check_type", "option", "values"]
