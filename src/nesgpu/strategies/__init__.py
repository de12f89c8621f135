"""ES strategies with one ask/tell shape over an explicit state: OpenAI-ES, ARS, PGPE; plus fitness shaping,
schedules, ClipUp. Adding a strategy is one file here plus one line in ``STRATEGIES``."""

from .ars import ARS
from .base import Strategy, StrategyState, check_fitness, fitness_statistics
from .clipup import ClipUp
from .openai_es import OpenAIES
from .pgpe import PGPE
from .schedules import Schedule, StepSizes
from .shaping import SHAPINGS, centered_ranks, raw, top_directions, z_score

STRATEGIES: dict[str, type[Strategy]] = {"openai_es": OpenAIES, "ars": ARS, "pgpe": PGPE}

__all__ = ["ARS", "ClipUp", "OpenAIES", "PGPE", "SHAPINGS", "STRATEGIES", "Schedule", "StepSizes", "Strategy",
           "StrategyState", "centered_ranks", "check_fitness", "fitness_statistics", "raw", "top_directions", "z_score"]
