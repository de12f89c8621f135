"""The training loop and what it writes: config, metrics, checkpoints, summary."""

from .config import TASK_DEFAULTS, TrainConfig
from .play import play_run
from .trainer import Interrupted, Run, build, evaluate_run, load_run, train

__all__ = ["TASK_DEFAULTS", "Interrupted", "Run", "TrainConfig", "build", "evaluate_run", "load_run", "play_run",
           "train"]
