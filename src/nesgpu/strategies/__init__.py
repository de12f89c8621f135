"""ES strategies with one ask/tell shape: OpenAI-ES, ARS, PGPE; plus fitness shaping, schedules, ClipUp."""

from .ars import ARS
from .base import Strategy, check_fitness
from .clipup import ClipUp
from .openai_es import OpenAIES
from .pgpe import PGPE
from .schedules import Schedule
from .shaping import SHAPINGS, centered_ranks, raw, top_directions, z_score

STRATEGIES: dict[str, type[Strategy]] = {"openai_es": OpenAIES, "ars": ARS, "pgpe": PGPE}

__all__ = ["ARS", "ClipUp", "OpenAIES", "PGPE", "SHAPINGS", "STRATEGIES", "Schedule", "Strategy",
           "centered_ranks", "check_fitness", "raw", "top_directions", "z_score"]
