"""Perturbation kinds: one file per kind, each a frozen dataclass of options over plain functions."""

from ..registry import Registry, subclass_of
from .base import Kind, Noise
from .flipout import Flipout
from .gaussian import Gaussian
from .lowrank import LowRank
from .ops import LINEAR, ConvOp, Geometry, LinearOp, Op
from .permuted import Permuted
from .sparse import Sparse

KINDS: Registry[type[Kind]] = Registry(
    "noise kind", subclass_of(Kind), "a subclass of nesgpu.kinds.Kind", options=lambda cls: cls,
    name_of=lambda cls: cls.name, entries=[(k.name, k) for k in (Gaussian, Sparse, Permuted, Flipout, LowRank)])
"""Every noise kind by its name; a kind is its own options dataclass. Add one with ``KINDS.register(name, cls)``
(:mod:`nesgpu.registry`)."""


def make_kind(kind: str | Kind, **options) -> Kind:
    """A kind from its name and options (``make_kind("lowrank", rank=2)``), or a Kind as given."""
    if isinstance(kind, Kind):
        if options:
            raise ValueError(f"options {sorted(options)} given with a Kind instance {kind!r}; set them on it")
        return kind
    cls = KINDS.lookup(kind)
    try:
        return cls(**options)
    except TypeError as e:
        import dataclasses
        fields = [f.name for f in dataclasses.fields(cls)]
        raise TypeError(f"kind {kind!r} takes options {fields}; got {sorted(options)}") from e


def check_kind_options(slots) -> None:
    """Each kind's options against all the matrices that take it: ``slots`` are (name, kind, geometry or None)
    for every perturbed parameter of a model (see :meth:`Kind.check_model`)."""
    by_kind: dict[Kind, dict[str, Geometry]] = {}
    for name, kind, geometry in slots:
        if geometry is not None:
            by_kind.setdefault(kind, {})[name] = geometry
    for kind, geometries in by_kind.items():
        kind.check_model(geometries)


__all__ = [
    "KINDS",
    "LINEAR",
    "ConvOp",
    "Flipout",
    "Gaussian",
    "Geometry",
    "Kind",
    "LinearOp",
    "LowRank",
    "Noise",
    "Op",
    "Permuted",
    "Sparse",
    "check_kind_options",
    "make_kind",
]
