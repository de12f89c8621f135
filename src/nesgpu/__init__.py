"""nesgpu: evolution strategies for PyTorch, with the whole population in one batched forward pass."""

import warnings

# torch runs without numpy (nesgpu's core needs only torch) but warns at import that it could not load it
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

from . import kinds  # noqa: E402
from .layers import *  # noqa: F403, E402
from .layers import __all__ as _layers  # noqa: E402
from .conversion import convert, summary  # noqa: E402
from .export import export  # noqa: E402
from .model import PerturbedModel  # noqa: E402
from .version import __version__  # noqa: F401, E402 (nesgpu.__version__)



def load_run(directory, device: str = "auto", model=None, task=None):
    """The trained model, task and config of a run directory (a run of your own model or task needs them
    again): see :func:`nesgpu.train.runs.load_run` (needs the ``[train]`` extra)."""
    from .train.runs import load_run as _load_run

    return _load_run(directory, device, model=model, task=task)


__all__ = ["PerturbedModel", "convert", "export", "kinds", "load_run", "summary", *_layers]
