"""Options of a component (a strategy, a task): a frozen dataclass whose fields carry a one-line doc, their
choices and their lower bound, checked once when it is built. The training configuration turns every field
of every registered component into a flat option of its own (``--top-b``, ``top_b:`` in YAML), owned by the
components that declare it (:class:`Owners`: the components of one kind and their options; see
:mod:`nesgpu.train.setup.options`).

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
from collections.abc import Mapping


def option(default, help: str, *, choices: tuple | None = None, at_least: float | None = None,
           above: float | None = None, at_most: float | None = None, arg: str | None = None):
    """A field of an options dataclass: its default and doc; ``choices`` and bounds (``at_least``, or
    ``above`` for a strict minimum; ``at_most``) that :func:`check_options` enforces, and ``arg``, the name
    of the constructor argument it sets when that differs from the option's name."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "at_least": at_least,
                                                        "above": above, "at_most": at_most, "arg": arg})


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
    """The components of one kind ("strategy", "task") and their Options, by the name the config uses."""

    kind: str
    registry: Mapping[str, type]
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # how an owner is named ("gym:<id>")

    def label(self, owner: str) -> str:
        return self.labels.get(owner, owner)

    def owners(self, name: str) -> list[str]:
        """The components whose options include ``name``."""
        return [o for o, options in self.registry.items() if name in {f.name for f in dataclasses.fields(options)}]

    def names(self) -> list[str]:
        """Every option's name, once, in the registry's order."""
        return list(dict.fromkeys(f.name for options in self.registry.values() for f in dataclasses.fields(options)))

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
        """Set to None, in ``values``, the options ``owner`` does not take. One that holds anything but None,
        an owner's default or ``allowed``'s value (older run directories recorded every option) is an error:
        an option that does not apply is never silently ignored."""
        own, allowed = self.defaults_of(owner), allowed or {}
        for name in self.names():
            value = values.get(name)
            if name in own or value is None:
                continue
            known = [self.defaults_of(o)[name] for o in self.owners(name)]
            known += [allowed[name]] if name in allowed else []
            if value not in known:
                raise self.refusal(name, value, owner)
            values[name] = None

    def own_only(self, values: dict, owner: str | None) -> dict:
        """A copy of ``values`` with every option ``owner`` does not take None (what a resolved configuration
        holds; older run directories recorded them all)."""
        own = self.defaults_of(owner)
        return {**values, **{name: None for name in self.names() if name not in own and name in values}}

    def config_fields(self) -> list[tuple[str, str, dataclasses.Field]]:
        """The configuration's fields of these options, for ``dataclasses.make_dataclass``: each None by
        default (its owner's default applies), with its owners' docs and choices. Components declaring one
        name must declare one type."""
        fields = []
        for name in self.names():
            declared = [(o, f) for o, options in self.registry.items() for f in dataclasses.fields(options)
                        if f.name == name]
            types = {annotation_text(f.type) for _, f in declared}
            if len(types) > 1:
                raise TypeError(f"{self.kind} option {name!r} is declared with different types {sorted(types)} by "
                                f"{[o for o, _ in declared]}")
            docs: dict[str, list[str]] = {}  # doc -> the owners that give it
            for o, f in declared:
                docs.setdefault(f.metadata["help"], []).append(self.label(o))
            help = "; ".join(f"{', '.join(who)}: {doc}" for doc, who in docs.items())
            if "default" not in help:
                shown = dict.fromkeys("none" if f.default is None else str(f.default) for _, f in declared)
                help += f" (default: {' / '.join(shown)})"
            first = declared[0][1]
            meta = {"help": help, "choices": first.metadata.get("choices"), "owned_by": self.kind}
            text = annotation_text(first.type)
            fields.append((name, text if "None" in text.split(" | ") else f"{text} | None",
                           dataclasses.field(default=None, metadata=meta)))
        return fields


__all__ = ["NoOptions", "Owners", "annotation_text", "arguments", "check_options", "check_type", "option", "values"]
