"""A module form: how one module type is recognised and converted in place (see :mod:`nesgpu.layers.form_table`),
and the options of a conversion that every form's ``adopt`` receives."""

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from torch import nn

from ..kinds import Kind

LOW_BIT_OPTIONS = ("bits", "act_bits")
"""convert's options that a form with a product refuses unless it names them in :attr:`Form.takes`."""


@dataclasses.dataclass(frozen=True)
class ConversionOptions:
    """What one ``convert`` call was asked for, as every form's ``adopt`` receives it.

    ``kind`` is the model's kind (``adopt``'s own ``kind`` argument is the one its module takes: IID Gaussian
    where the model's has no product for it); ``forms`` holds each registered form's own options (its
    :attr:`Form.options` dataclass, with convert's values where given, else its defaults), read by
    :meth:`of`."""

    kind: Kind
    directions: int | None = None
    bits: int | None = None
    noise_on: str = "latent"
    act_bits: int | None = None
    evolve: str = "all"
    freeze: tuple[str, ...] = ()
    fallback: frozenset[str] = frozenset()
    forms: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        object.__setattr__(self, "forms", MappingProxyType(dict(self.forms)))  # read-only

    def of(self, form: str) -> Any:
        """The options of the form named ``form`` (an instance of its :attr:`Form.options`)."""
        if form not in self.forms:
            raise ValueError(f"no options of a module form named {form!r}; expected one of {sorted(self.forms)} "
                             f"(a form declares them with Form(..., options=MyOptions))")
        return self.forms[form]


class Form(NamedTuple):
    """A module form: ``detect(module)`` returns what it found (anything but None or False) or None;
    ``adopt(module, found, kind, options)`` converts the module in place and returns it, its matrices with
    ``kind``, which has ``product`` ("linear", "embedding", "experts", ...; None: elementwise noise only), and
    ``options`` the conversion's :class:`ConversionOptions`.

    ``options``: a dataclass of the form's own options (each with a default): ``convert(model, kind,
    name=value)`` passes an option the kind does not take to every form that declares it, and ``adopt``
    reads them as ``options.of(form_name)``. ``takes``: which of convert's low-bit options (:data:`LOW_BIT_OPTIONS`)
    this form honours; a form with a product is refused any other that is set, by name. ``always``: asked for
    every module with something to perturb (a torch type rebuilt whole, such as a MultiheadAttention whose
    trainable parameters may all be its out_proj's); otherwise only for one with trainable parameters of its
    own."""

    name: str
    detect: Callable[[nn.Module], Any]
    adopt: Callable[[nn.Module, Any, Kind, ConversionOptions], nn.Module]
    product: str | None
    options: type | None = None
    takes: frozenset[str] = frozenset()
    always: bool = False
