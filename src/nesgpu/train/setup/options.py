"""The options the training configuration takes from its components. Every field of a strategy's
``Options`` (backprop's too) and of a built-in task's becomes a flat option of the configuration, of the CLI
(``--top-b``, ``--episodes``) and of config files (``top_b:``), owned by the components that declare it; its
default there is None, "the owner's own". A resolved configuration holds the values of its strategy's and its
task's options and None for every other's; one set under another owner is an error that names its owners.

Adding a strategy or a task with options of its own touches nothing here: its ``Options`` are read from the
registries (``nesgpu.strategies.STRATEGIES``, ``nesgpu.tasks.TASKS``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from ...options import annotation_text
from ...options import values as option_values
from ...strategies import STRATEGIES
from ...tasks import TASKS
from ..steps.backprop import BackpropOptions

# the gradient baseline: not an ES strategy (no population, no noise) but a strategy name of the config
BACKPROP = "backprop"


@dataclass(frozen=True)
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
        return option_values(options()) if options is not None else {}

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


# every strategy's options, by the strategy's config name; every built-in task's, by its registry key
STRATEGY = Owners("strategy", {**{name: cls.Options for name, cls in STRATEGIES.items()}, BACKPROP: BackpropOptions})
TASK = Owners("task", {name: spec.options for name, spec in TASKS.items()}, labels={"gym": "gym:<id>"})


def task_key(task: str) -> str | None:
    """The registry key that owns a task name's options ("gym" for gym:<id>; None for a task of your own)."""
    if task.startswith("gym:"):
        return "gym"
    return task if task in TASKS else None


def own_only(values: dict, strategy: str, task: str) -> dict:
    """``values`` with the options neither ``strategy`` nor ``task`` takes set to None."""
    return TASK.own_only(STRATEGY.own_only(values, strategy), task_key(task))


__all__ = ["BACKPROP", "STRATEGY", "TASK", "Owners", "own_only", "task_key"]
