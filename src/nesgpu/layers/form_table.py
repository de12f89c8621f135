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
from ..registry import Registry, instance_of
from .form import Form

BUILTIN: tuple[Form, ...] = (*hf_linear.HF_FORMS, *hf_moe.HF_FORMS, *hf_norm.HF_FORMS, *hf_attention.HF_FORMS)
"""transformers' module types, in the order they are asked: linear and embedding types, MoE, norms, attention
sinks."""


FORMS: Registry[Form] = Registry("module form", instance_of(Form), "a nesgpu.layers.Form", name_of=lambda f: f.name)
"""Forms of your own, by name (:func:`register_form`); the most recently registered is asked first, and all of
them before the built-in ones."""


def register_form(form: Form) -> None:
    """Add ``form`` to :data:`FORMS`: asked before the built-in forms and before forms registered earlier."""
    FORMS.register(form.name if isinstance(form, Form) else None, form)


def recognise(module: nn.Module) -> tuple[Form, Any] | None:
    """The first form that detects ``module``, and what it found (each detection, each probe, runs once)."""
    for form in (*reversed(list(FORMS.values())), *BUILTIN):
        found = form.detect(module)
        if found is not None and found is not False:
            return form, found
    return None
