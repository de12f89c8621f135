"""What a perturbed module records about its parameters and its population call. The annotations here are
evaluated (no postponed annotations), so that tools reading the tuples' generated ``__new__`` see the types."""

from typing import NamedTuple

from ..kinds import Geometry, Kind


class Slot(NamedTuple):
    """One perturbed parameter of a module: its attribute name, kind and geometry (None: elementwise)."""

    name: str
    kind: Kind
    geometry: Geometry | None


class Active(NamedTuple):
    """The population settings while a module is inside ``perturbing``."""

    sigma: float
    antithetic: bool
