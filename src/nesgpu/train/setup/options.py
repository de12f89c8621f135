"""The options the training configuration takes from its components. Every field of a strategy's
``Options`` (and of backprop's) becomes a flat option of the configuration, of the CLI (``--top-b``) and of
config files (``top_b:``), owned by the components that declare it; its default there is None, "the
owner's own". A resolved configuration holds the values of its strategy's options and None for every other
strategy's; one set under another strategy is an error that names its owners.

Adding a strategy with options of its own touches nothing here: its ``Options`` are read from the registry.
"""

from __future__ import annotations

import dataclasses

from ...options import annotation_text
from ...options import values as option_values
from ...strategies import STRATEGIES
from ..steps.backprop import BackpropOptions

# the gradient baseline: not an ES strategy (no population, no noise) but a strategy name of the config
BACKPROP = "backprop"
# every strategy's options, by the strategy's config name
STRATEGY_OPTIONS: dict[str, type] = {**{name: cls.Options for name, cls in STRATEGIES.items()},
                                     BACKPROP: BackpropOptions}


def owners(name: str) -> list[str]:
    """The strategies whose options include ``name``."""
    return [s for s, options in STRATEGY_OPTIONS.items() if name in {f.name for f in dataclasses.fields(options)}]


def option_names() -> list[str]:
    """Every strategy option's name, once, in the registry's order."""
    return list(dict.fromkeys(f.name for options in STRATEGY_OPTIONS.values() for f in dataclasses.fields(options)))


def _optional(annotation: str) -> str:
    return annotation if "None" in annotation.split(" | ") else f"{annotation} | None"


def config_fields() -> list[tuple[str, str, dataclasses.Field]]:
    """The configuration's fields of the strategy options, for ``dataclasses.make_dataclass``: each is None
    by default (its owner's default applies), with its owners' doc and choices. Two strategies declaring one
    name must declare one type."""
    fields = []
    for name in option_names():
        declared = [(s, f) for s, options in STRATEGY_OPTIONS.items() for f in dataclasses.fields(options)
                    if f.name == name]
        types = {annotation_text(f.type) for _, f in declared}
        if len(types) > 1:
            raise TypeError(f"strategy option {name!r} is declared with different types {sorted(types)} by "
                            f"{[s for s, _ in declared]}")
        first = declared[0][1]
        docs = {f.metadata["help"] for _, f in declared}
        help = (f"{', '.join(s for s, _ in declared)}: {first.metadata['help']}" if len(docs) == 1
                else "; ".join(f"{s}: {f.metadata['help']}" for s, f in declared))
        if "default" not in help:
            shown = dict.fromkeys("none" if f.default is None else str(f.default) for _, f in declared)
            help += f" (default: {' / '.join(shown)})"
        meta = {"help": help, "choices": first.metadata.get("choices"), "owners": tuple(s for s, _ in declared),
                "strategy_option": True}
        fields.append((name, _optional(annotation_text(first.type)), dataclasses.field(default=None, metadata=meta)))
    return fields


def defaults_of(strategy: str) -> dict:
    """The options of ``strategy`` at their defaults (an unknown strategy: none)."""
    options = STRATEGY_OPTIONS.get(strategy)
    return option_values(options()) if options is not None else {}


def options_of(strategy: str, values: dict):
    """``strategy``'s Options built from the config ``values`` of its options (None: the default), checked
    by the Options themselves."""
    options = STRATEGY_OPTIONS[strategy]
    own = {f.name: values[f.name] for f in dataclasses.fields(options) if values.get(f.name) is not None}
    return options(**own)


def drop_foreign(values: dict, strategy: str, allowed: dict) -> None:
    """Set to None, in ``values``, the options of other strategies than ``strategy``. One that holds
    anything but None, its owners' default or ``allowed``'s value (the task's, which older run directories
    recorded for every strategy) is an error: an option of another strategy is never silently ignored."""
    own = defaults_of(strategy)
    for name in option_names():
        value = values.get(name)
        if name in own or value is None:
            continue
        known = [defaults_of(s)[name] for s in owners(name)] + ([allowed[name]] if name in allowed else [])
        if value not in known:
            mine = owners(name)
            raise ValueError(f"option {name!r} (= {value!r}) applies to strategy {' or '.join(map(repr, mine))}, "
                             f"not {strategy!r}; drop it or choose --strategy {mine[0]}")
        values[name] = None


def own_only(values: dict, strategy: str) -> dict:
    """A copy of ``values`` with every option that is not ``strategy``'s None (what a resolved configuration
    of ``strategy`` holds; older run directories recorded every strategy's)."""
    own = defaults_of(strategy)
    return {**values, **{name: None for name in option_names() if name not in own and name in values}}


__all__ = ["own_only", "BACKPROP", "STRATEGY_OPTIONS", "config_fields", "defaults_of", "drop_foreign", "option_names",
           "options_of", "owners"]
