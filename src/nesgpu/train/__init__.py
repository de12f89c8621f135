"""The training loop and what it writes: config, metrics, checkpoints, summary."""

from .config import TASK_DEFAULTS, TrainConfig
from .trainer import build, evaluate_run, train

__all__ = ["TASK_DEFAULTS", "TrainConfig", "build", "evaluate_run", "train"]
