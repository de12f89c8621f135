"""ES strategies with one ask/tell shape over an explicit state: OpenAI-ES, ARS, PGPE, SNES, xNES, CEM,
separable and full CMA-ES; plus fitness shaping, schedules, ClipUp. Adding a strategy is one file here plus one
registration in ``STRATEGIES`` (``STRATEGIES.register("name", YourStrategy)``, see :mod:`nesgpu.registry`): its
``Options`` (a frozen dataclass, see :mod:`nesgpu.options`) become options of the training configuration and flags
of the CLI."""

from ..registry import Registry, subclass_of
from .ars import ARS, ARSOptions
from .base import Strategy, StrategyState, check_fitness, fitness_statistics
from .cem import CEM, CEMOptions
from .clipup import ClipUp
from .cma_es import CMAES
from .openai_es import OpenAIES, OpenAIESOptions
from .pgpe import PGPE, PGPEOptions
from .schedules import Schedule, StepSizes
from .sep_cma_es import SepCMAES
from .shaping import SHAPINGS, centered_ranks, raw, top_directions, z_score
from .snes import SNES, SNESOptions
from .xnes import XNES

STRATEGIES: Registry[type[Strategy]] = Registry(
    "strategy", subclass_of(Strategy), "a subclass of nesgpu.strategies.Strategy", options=lambda cls: cls.Options,
    entries=[("openai_es", OpenAIES), ("ars", ARS), ("pgpe", PGPE), ("snes", SNES), ("cem", CEM),
             ("sep_cma_es", SepCMAES), ("cma_es", CMAES), ("xnes", XNES)])

__all__ = ["ARS", "ARSOptions", "CEM", "CEMOptions", "CMAES", "ClipUp", "OpenAIES", "OpenAIESOptions", "PGPE",
           "PGPEOptions", "SHAPINGS", "SNES", "SNESOptions", "STRATEGIES", "Schedule", "SepCMAES", "StepSizes",
           "Strategy", "StrategyState", "XNES", "centered_ranks", "check_fitness", "fitness_statistics", "raw",
           "top_directions", "z_score"]
