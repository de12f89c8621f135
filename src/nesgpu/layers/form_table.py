"""The table of module forms: how a module is recognised and converted. A :class:`Form` detects (a check of the
module's class, or a probe of what its forward computes) and adopts: a torch type is rebuilt as its perturbed
class (:data:`nesgpu.layers.registry.TORCH_FORMS`); a module type nesgpu does not rebuild (transformers' types,
your own) is converted in place by a class swap (:func:`nesgpu.layers.swap.swap_class`), so that its
state_dict and plain forward stay. ``convert`` asks the forms in order (:func:`forms`); the first that detects
a module adopts it, given the conversion's :class:`ConversionOptions`.

Register your own with :func:`register_form` (PEFT's custom-module dispatch is the model): a module type of
yours that computes a batched perturbed product, converted instead of taking the exact fallback. A form may
declare options of its own, which convert takes by name (docs/architecture.md, "A module form with an option
of its own").

    >>> nesgpu.layers.register_form(Form("my_linear", lambda m: isinstance(m, MyLinear), adopt_my_linear, "linear"))
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from . import hf_attention, hf_linear, hf_moe, hf_norm
from ..kinds import KINDS, Kind, make_kind
from ..registry import Registry, instance_of
from .form import LOW_BIT_OPTIONS, ConversionOptions, Form
from .registry import TORCH_FORMS

BUILTIN: tuple[Form, ...] = (*hf_linear.HF_FORMS, *hf_moe.HF_FORMS, *hf_norm.HF_FORMS, *hf_attention.HF_FORMS)
"""transformers' module types, in the order they are asked (after the torch types): linear and embedding
types, MoE, norms, attention sinks."""


FORMS: Registry[Form] = Registry("module form", instance_of(Form), "a nesgpu.layers.Form", name_of=lambda f: f.name)
"""Forms of your own, by name (:func:`register_form`); the most recently registered is asked first, and all of
them before the built-in ones."""

RESERVED = frozenset({"model", "kind", *(f.name for f in dataclasses.fields(ConversionOptions))} - {"forms"})
"""convert's own arguments: no form's option may take one of these names."""


def register_form(form: Form) -> None:
    """Add ``form`` to :data:`FORMS`: asked before the built-in forms and before forms registered earlier."""
    if isinstance(form, Form):
        _check_form(form)
    FORMS.register(form.name if isinstance(form, Form) else None, form)


def _check_form(form: Form) -> None:
    """A form's own options: a dataclass whose fields all have defaults and are not convert's own arguments;
    ``takes``: some of :data:`LOW_BIT_OPTIONS`."""
    if form.options is not None:
        if not (isinstance(form.options, type) and dataclasses.is_dataclass(form.options)):
            raise TypeError(f"module form {form.name!r}: options must be a dataclass of its options; got "
                            f"{form.options!r}")
        fields = dataclasses.fields(form.options)
        taken = [f.name for f in fields if f.name in RESERVED]
        required = [f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        if taken or required:
            raise ValueError(f"module form {form.name!r}: options {taken or required} "
                             f"{'are arguments of convert itself' if taken else 'have no default'}; expected "
                             f"options with defaults, named other than {sorted(RESERVED)}")
    if not isinstance(form.takes, frozenset) or not form.takes <= set(LOW_BIT_OPTIONS):
        raise ValueError(f"module form {form.name!r}: takes must be a frozenset of some of {list(LOW_BIT_OPTIONS)}; "
                         f"got {form.takes!r}")


def forms() -> list[Form]:
    """Every form, in the order ``convert`` asks them: yours (the most recently registered first), the torch
    types (:data:`nesgpu.layers.registry.TORCH_FORMS`), then transformers' (:data:`BUILTIN`)."""
    return [*reversed(list(FORMS.values())), *TORCH_FORMS, *BUILTIN]


def recognise(module: nn.Module, own: bool) -> tuple[Form, Any] | None:
    """The first form that detects ``module``, and what it found (each detection, each probe, runs once);
    ``own``: whether ``module`` holds trainable parameters of its own (else only forms with ``always`` are
    asked)."""
    for form in forms():
        if own or form.always:
            found = form.detect(module)
            if found is not None and found is not False:
                return form, found
    return None


def conversion_options(kind: str | Kind, options: dict[str, Any], **settings) -> ConversionOptions:
    """One conversion's options: ``options`` (convert's ``**options``) go to the kind (those its class takes)
    and to every form whose :attr:`Form.options` declares them; ``settings`` are the other fields of
    :class:`ConversionOptions`. An option that neither the kind nor a form takes is a TypeError."""
    with_options = [f for f in forms() if f.options is not None]
    declared = {f.name: {field.name for field in dataclasses.fields(f.options)} for f in with_options}
    for_forms = set().union(*declared.values())
    takes = {f.name for f in dataclasses.fields(KINDS.lookup(kind))} if isinstance(kind, str) else set()
    try:
        made = make_kind(kind, **{k: v for k, v in options.items() if k not in for_forms or k in takes})
    except TypeError as e:
        if not for_forms:
            raise
        raise TypeError(f"{e}; the registered module forms take options {sorted(for_forms)}") from e
    own = {f.name: f.options(**{k: v for k, v in options.items() if k in declared[f.name]}) for f in with_options}
    return ConversionOptions(made, **settings, forms=own)
