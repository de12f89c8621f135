"""Options of a component (a strategy, a task): a frozen dataclass whose fields carry a one-line doc, their
choices and their lower bound, checked once when it is built. The training configuration turns every field
of every registered component into a flat option of its own (``--top-b``, ``top_b:`` in YAML), owned by the
components that declare it; see :mod:`nesgpu.train.setup.options`.

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


__all__ = ["NoOptions", "annotation_text", "arguments", "check_options", "check_type", "option", "values"]
