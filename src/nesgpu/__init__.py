"""nesgpu: evolution strategies for PyTorch, with the whole population in one batched forward pass."""

from . import kinds
from .layers import *  # noqa: F403
from .layers import __all__ as _layers
from .model import PerturbedModel, convert

__version__ = "0.1.0"

__all__ = ["PerturbedModel", "convert", "kinds", *_layers]
