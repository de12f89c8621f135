"""One registry for every kind of component: strategies (``nesgpu.strategies.STRATEGIES``), tasks
(``nesgpu.tasks.TASKS``), noise kinds (``nesgpu.kinds.KINDS``) and module forms of your own
(``nesgpu.layers.FORMS``).

A component is its own file plus one registration, where its kind is assembled or in your own code::

    STRATEGIES.register("baseline_es", BaselineES)

Each component is checked when it is registered (a ``TypeError`` says what was expected and what was got), a
name taken by another component is a ``ValueError`` unless ``replace=True`` says the replacement is meant, and
:meth:`Registry.lookup` names the registered components when a name is unknown. ``registry[name] = component``
replaces, as a dict's assignment does (``pytest``'s ``monkeypatch.setitem`` uses it), and is checked too.
:meth:`Registry.options` gives a component's options dataclass (its fields become options of the training
configuration and flags of the command line: see :mod:`nesgpu.options`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(MutableMapping, Generic[T]):
    """Name -> component of one kind, in registration order.

    Args:
        what: what a component is, for messages ("strategy", "noise kind").
        accepts: whether an object may be registered (a class of the right base, an instance of a spec type).
        expected: what ``accepts`` takes, in words, for the TypeError.
        options: a component's options dataclass (None: components of this kind take no options).
        name_of: the name a component gives itself (a noise kind's, a form's), which must be the name it is
            registered under (None: components carry no name of their own).
        entries: (name, component) pairs registered at once, in order.
    """

    def __init__(self, what: str, accepts: Callable[[object], bool], expected: str,
                 options: Callable[[T], type] | None = None, name_of: Callable[[T], str] | None = None,
                 entries: Iterable[tuple[str, T]] = ()):
        self.what, self.expected = what, expected
        self._accepts, self._options, self._name_of = accepts, options, name_of
        self._entries: dict[str, T] = {}
        for name, component in entries:
            self.register(name, component)

    def register(self, name: str, component: T, *, replace: bool = False) -> T:
        """Add ``component`` under ``name`` (returned, so that it can decorate a class's registration)."""
        if not self._accepts(component):
            raise TypeError(f"a {self.what} must be {self.expected}; got {component!r} ({type(component).__name__})")
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"a {self.what}'s name must be a non-empty string; got {name!r}")
        if self._name_of is not None and self._name_of(component) != name:
            raise ValueError(f"a {self.what} is registered under its own name: {component!r} names itself "
                             f"{self._name_of(component)!r}, not {name!r}")
        taken = self._entries.get(name)
        if taken is not None and not replace:
            raise ValueError(f"a {self.what} named {name!r} is registered already ({taken!r}); choose another name "
                             f"or pass replace=True")
        self._entries[name] = component
        return component

    def lookup(self, name: str) -> T:
        """The component named ``name``; a ValueError names the registered ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.what} {name!r}; expected one of {sorted(self._entries)}") from None

    def options(self, name: str) -> type | None:
        """The options dataclass of the component named ``name`` (None where components take none)."""
        return None if self._options is None else self._options(self.lookup(name))

    def options_by_name(self) -> dict[str, type]:
        """Every component's options dataclass, by name, in registration order."""
        return {name: self.options(name) for name in self._entries} if self._options is not None else {}

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __setitem__(self, name: str, component: T) -> None:
        self.register(name, component, replace=True)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._entries)})"


def subclass_of(base: type) -> Callable[[object], bool]:
    """``accepts`` for registries of classes: a subclass of ``base``."""
    return lambda component: isinstance(component, type) and issubclass(component, base)


def instance_of(kind: type) -> Callable[[object], bool]:
    """``accepts`` for registries of objects: an instance of ``kind``."""
    return lambda component: isinstance(component, kind)


__all__ = ["Registry", "instance_of", "subclass_of"]
