"""nesgpu: evolution strategies for PyTorch, with the whole population in one batched forward pass."""

from . import kinds
from .layers import *  # noqa: F403
from .layers import __all__ as _layers
from .conversion import convert, summary
from .model import PerturbedModel
from .version import __version__  # noqa: F401 (nesgpu.__version__)



def load_run(directory, device: str = "auto", model=None, task=None):
    """The trained model, task and config of a run directory (a run of your own model or task needs them
    again): see :func:`nesgpu.train.runs.load_run` (needs the ``[train]`` extra)."""
    from .train.runs import load_run as _load_run

    return _load_run(directory, device, model=model, task=task)


__all__ = ["PerturbedModel", "convert", "kinds", "load_run", "summary", *_layers]
