"""nesgpu: evolution strategies for PyTorch, with the whole population in one batched forward pass."""

from . import kinds
from .layers import *  # noqa: F403
from .layers import __all__ as _layers
from .conversion import convert, summary
from .model import PerturbedModel

__version__ = "0.1.0"  # the only version: pyproject.toml reads this literal statically (no import)


def load_run(directory, device: str = "auto"):
    """The trained model, task and config of a run directory: see :func:`nesgpu.train.trainer.load_run`
    (needs the ``[train]`` extra)."""
    from .train.trainer import load_run as _load_run

    return _load_run(directory, device)


__all__ = ["PerturbedModel", "convert", "kinds", "load_run", "summary", *_layers]
