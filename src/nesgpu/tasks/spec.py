"""What the registry knows of a built-in task: how :func:`nesgpu.tasks.make_task` builds it, which models
it has, and the options it was tuned with. Each task module declares its own; the training config reads
them, so adding a task is one module plus one line in ``nesgpu.tasks.TASKS``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..options import NoOptions, check_options, option

# the largest count an option takes (a step's samples, episodes): beyond it, a typo rather than a plan
MAX_COUNT = 1 << 40


@dataclass(frozen=True)
class BatchOptions:
    """The options of a task that trains on minibatches (the supervised and sequence tasks)."""

    batch_size: int = option(64, "samples per member per step", at_least=1, at_most=MAX_COUNT, defines=True)

    def __post_init__(self):
        check_options(self, "supervised task")


def batch_maker(factory: Callable):
    """A maker (``make(name, context, options)``) of a minibatch task ``factory(device, seed, batch_size)`` makes."""
    def make(name: str, where: TaskContext, options: BatchOptions):
        return factory(device=where.device, seed=where.seed, batch_size=options.batch_size)
    return make


@dataclass(frozen=True)
class TaskContext:
    """Where and how a task runs, beside its own options: what ``make_task`` passes to a task's maker with
    them (``make(name, context, options)``)."""

    device: torch.device | str = "cpu"
    seed: int = 0
    normalize_observations: bool = True  # RL tasks: running observation statistics in the policy
    compile: bool = False  # the compiled path (built-in torch environments, population decode)
    model: str | None = None  # the config's model option (the language-model tasks: hf:DIR)
    dtype: str | None = None  # the dtype a Hugging Face model is loaded in (None: its checkpoint's)


@dataclass(frozen=True)
class TaskSpec:
    """A built-in task.

    Attributes:
        make: ``make(name, context, options) -> task``: a :class:`TaskContext` and the task's own ``options``.
        defaults: the options a run of this task starts from (population, sigma, lr, steps, hidden, ...; the
            strategy too, when it is not OpenAI-ES), tuned for it.
        models: the architectures its ``make_model`` builds; the first is the default.
        model_defaults: what a non-default model changes over ``defaults``.
        supervised: whether it has a differentiable loss (a backprop run can train it) and no environment.
        env_steps: for the built-in torch environments, the steps of one episode (which ``compile="auto"``
            counts); None for every other task.
        model_prefix: for tasks whose model option names a location (``hf:DIR``), its prefix; ``models``
            then holds the placeholder.
        options: its options, a frozen dataclass (see :mod:`nesgpu.options`) whose fields the training
            configuration and the CLI offer when the task is chosen (``--episodes``); ``defaults`` may set them
            too. It may define ``run_defaults(strategy) -> dict`` (defaults that depend on the run's strategy,
            by name; None for backprop) and ``for_run(strategy, hidden) -> Options`` (its "auto" values settled
            for the run).
    """

    make: Callable[[str, TaskContext, object], object]
    defaults: Mapping[str, object]
    models: tuple[str, ...] = ("mlp",)
    model_defaults: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    supervised: bool = False
    env_steps: int | None = None
    model_prefix: str | None = None
    options: type = NoOptions


__all__ = ["MAX_COUNT", "BatchOptions", "TaskContext", "TaskSpec", "batch_maker"]
