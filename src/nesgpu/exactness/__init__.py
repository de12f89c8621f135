"""Exactness on the user's own model: :func:`check` proves that every population row equals its member's
own model, module by module, in float64; ``nesgpu check`` does it from the command line."""

from .check import check
from .report import CheckReport, ModuleError

__all__ = ["CheckReport", "ModuleError", "check"]
