"""ES strategies with one ask/tell shape over an explicit state: OpenAI-ES, ARS, PGPE; plus fitness shaping,
schedules, ClipUp. Adding a strategy is one file here plus one line in ``STRATEGIES``: its ``Options`` (a frozen
dataclass, see :mod:`nesgpu.options`) become options of the training configuration and flags of the CLI."""

from .ars import ARS, ARSOptions
from .base import Strategy, StrategyState, check_fitness, fitness_statistics
from .clipup import ClipUp
from .openai_es import OpenAIES, OpenAIESOptions
from .pgpe import PGPE, PGPEOptions
from .schedules import Schedule, StepSizes
from .shaping import SHAPINGS, centered_ranks, raw, top_directions, z_score

STRATEGIES: dict[str, type[Strategy]] = {"openai_es": OpenAIES, "ars": ARS, "pgpe": PGPE}

__all__ = ["ARS", "ARSOptions", "ClipUp", "OpenAIES", "OpenAIESOptions", "PGPE", "PGPEOptions", "SHAPINGS",
           "STRATEGIES", "Schedule", "StepSizes", "Strategy", "StrategyState", "centered_ranks", "check_fitness",
           "fitness_statistics", "raw", "top_directions", "z_score"]
