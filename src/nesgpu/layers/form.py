"""A module form: how one module type is recognised and converted in place (see :mod:`nesgpu.layers.form_table`)."""

from collections.abc import Callable
from typing import Any, NamedTuple

from torch import nn

from ..kinds import Kind


class Form(NamedTuple):
    """A module form: ``detect(module)`` returns what it found (anything but None or False) or None;
    ``adopt(module, found, kind, directions)`` converts the module in place and returns it, its matrices with
    ``kind``, which has ``product`` ("linear", "embedding", "experts", ...; None: elementwise noise only)."""

    name: str
    detect: Callable[[nn.Module], Any]
    adopt: Callable[[nn.Module, Any, Kind, int | None], nn.Module]
    product: str | None
