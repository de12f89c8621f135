"""The one place where a module's class is swapped in place for a perturbed subclass of its own.

Modules whose library nesgpu does not import (transformers' Conv1D, RMSNorm classes, MoE expert banks)
and modules that take the exact fallback keep their object, parameters, state_dict and plain forward: only
their class gains a population forward, as the first base of a new subclass of their own class. Transformer
layers take their plain path this way, and the trainer's activation checkpointing wraps blocks this way.
"""

from __future__ import annotations

from torch import nn


def swap_class(module: nn.Module, mixin: type, prefix: str, exact: type | None = None, **attributes) -> nn.Module:
    """Make ``module`` (in place) an instance of ``type(prefix + name, (mixin, type(module)), attributes)``;
    a module whose class is ``exact`` (a class ``mixin`` already derives from) becomes a ``mixin`` itself."""
    cls = type(module)
    if exact is not None and cls is exact:
        module.__class__ = mixin
        return module
    module.__class__ = type(f"{prefix}{cls.__name__}", (mixin, cls),
                            {"__module__": cls.__module__, "__doc__": mixin.__doc__, **attributes})
    return module
