"""The training loop and what it writes: config, metrics, checkpoints, summary. ``train`` takes the
config's built-in task and model, or your own.

Rooms: ``setup`` (the configuration and what a run is built from), ``steps`` (the ES step and the backprop
baseline), ``storage`` (the run directory, checkpoints, resume, metrics, trackers); the loop itself is
``loop.py`` and ``trainer.py``. The command-line front ends are :mod:`nesgpu.frontends`."""

from .setup.build import Built, build
from .setup.config import TASK_DEFAULTS, TrainConfig
from .storage.runs import Run, evaluate_run, load_run
from .trainer import Interrupted, train

__all__ = ["TASK_DEFAULTS", "Built", "Interrupted", "Run", "TrainConfig", "build", "evaluate_run", "load_run",
           "train"]
