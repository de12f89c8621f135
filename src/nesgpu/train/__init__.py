"""The training loop and what it writes: config, metrics, checkpoints, summary. ``train`` takes the
config's built-in task and model, or your own."""

from .build import Built, build
from .config import TASK_DEFAULTS, TrainConfig
from .play import play_run
from .runs import Run, evaluate_run, load_run
from .trainer import Interrupted, train

__all__ = ["TASK_DEFAULTS", "Built", "Interrupted", "Run", "TrainConfig", "build", "evaluate_run", "load_run",
           "play_run", "train"]
