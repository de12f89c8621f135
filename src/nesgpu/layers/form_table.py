"""The table of module forms: how a module type nesgpu does not rebuild (transformers' types, your own) is
recognised and converted in place. A :class:`Form` detects (a check of the module's class, or a probe of what
its forward computes) and adopts (a class swap, :func:`nesgpu.layers.swap.swap_class`, so that its state_dict
and plain forward stay). ``convert`` asks the forms in order; the first that detects a module adopts it.

Register your own with :func:`register_form` (PEFT's custom-module dispatch is the model): a module type of
yours that computes a batched perturbed product, converted instead of taking the exact fallback.

    >>> nesgpu.layers.register_form(Form("my_linear", lambda m: isinstance(m, MyLinear), adopt_my_linear, "linear"))
"""

from __future__ import annotations

from typing import Any

from torch import nn

from . import hf_attention, hf_linear, hf_moe, hf_norm
from .form import Form

BUILTIN: tuple[Form, ...] = (*hf_linear.FORMS, *hf_moe.FORMS, *hf_norm.FORMS, *hf_attention.FORMS)
"""transformers' module types, in the order they are asked: linear and embedding types, MoE, norms, attention
sinks."""


REGISTERED: list[Form] = []
"""Forms registered with :func:`register_form`, asked before the built-in ones (a registry)."""


def register_form(form: Form) -> None:
    """Add ``form`` to the table, before the built-in forms (and before forms registered earlier)."""
    if not isinstance(form, Form):
        raise TypeError(f"form must be a nesgpu.layers.Form; got {type(form).__name__}")
    if any(f.name == form.name for f in REGISTERED):
        raise ValueError(f"a form named {form.name!r} is registered already")
    REGISTERED.insert(0, form)


def recognise(module: nn.Module) -> tuple[Form, Any] | None:
    """The first form that detects ``module``, and what it found (each detection, each probe, runs once)."""
    for form in (*REGISTERED, *BUILTIN):
        found = form.detect(module)
        if found is not None and found is not False:
            return form, found
    return None
