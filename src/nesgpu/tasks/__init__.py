"""Tasks: rows in, fitness (R, D) out. Supervised datasets, sequence tasks and RL environments.

``TASKS`` is the registry of tasks (each module declares its own, with its tuned defaults): adding a task is
one module plus one registration (``TASKS.register("name", TaskSpec(...))``, see :mod:`nesgpu.registry`). Any
object meeting :class:`~nesgpu.tasks.protocol.Task` trains too.
"""

from __future__ import annotations

import torch

from ..options import Owners
from ..registry import Registry, instance_of
from . import control, dataset_tasks, gym_tasks, reward_tasks, sequence, supervised
from .envs import ENVS
from .generation import GenerationTask
from .gym import GymVectorEnv
from .protocol import DifferentiableTask, ModelMaker, Task
from .rl import ObservationNorm, Policy, RLTask, rollout
from .sequence import SequenceTask, SequenceTransformer, reverse, sort
from .spec import TaskContext, TaskSpec
from .streaming import StepBatchSampler, StreamingClassificationTask
from .supervised import ClassificationTask, Conv1dNet, digits, mnist1d

TASKS: Registry[TaskSpec] = Registry(
    "task", instance_of(TaskSpec), "a nesgpu.tasks.TaskSpec", options=lambda spec: spec.options,
    entries=[*supervised.TASKS.items(), *sequence.TASKS.items(), *control.TASKS.items(), *gym_tasks.TASKS.items(),
             *reward_tasks.TASKS.items(), *dataset_tasks.TASKS.items()])
# every task's options by its registry key (read at each call: a task registered later counts)
TASK_OPTIONS = Owners("task", TASKS.options_by_name, labels={"gym": "gym:<id>"})


def supervised_tasks() -> list[str]:
    """The registered tasks with a differentiable loss (a backprop run can train them)."""
    return sorted(name for name, spec in TASKS.items() if spec.supervised)


def task_names() -> list[str]:
    """Every task name the config takes: the supervised ones first, gym:<id> last."""
    supervised = supervised_tasks()
    return [*supervised, *sorted(n for n in TASKS if n not in supervised and n != "gym"), "gym:<id>"]


def task_key(name: str) -> str | None:
    """The registry key of a task name ("gym" for gym:<id>; None for a task that is not registered)."""
    if name.startswith("gym:"):
        return "gym"
    return name if name in TASKS else None


def task_spec(name: str) -> TaskSpec:
    """The registry's entry of a task name (``gym:<id>``: the "gym" entry); a ValueError names the tasks."""
    key = task_key(name)
    if key is None or name in ("gym", "gym:"):
        raise ValueError(f"unknown task {name!r}; expected one of {task_names()}")
    return TASKS[key]


def model_choices(task: str) -> tuple[str, ...]:
    """The architectures ``make_model`` of a task builds; the first is its default (RL tasks: "mlp")."""
    return TASKS[task].models if task in TASKS else ("mlp",)


def make_task(name: str, device: torch.device | str = "cpu", seed: int = 0, normalize_observations: bool = True,
              compile: bool = False, model: str | None = None, dtype: str | None = None, **options):
    """A task by name: "digits", "mnist1d", "reverse", "sort", "cartpole", "pendulum", "acrobot", "mountaincar",
    "arithmetic", "countdown", "generation" or "gym:<id>". ``options`` are the task's own (its spec's
    ``options``: the supervised and sequence tasks' ``batch_size``; the RL tasks' ``episodes``,
    ``eval_episodes``, ``reward_shift``, ``start_states``, ``policy_output``, ``observation_clip`` (see
    :class:`~nesgpu.tasks.rl_options.RLOptions`), and gym:<id>'s ``vector_mode``; the language-model tasks'
    ``batch_size``, prompts per step, ...); an option of other tasks is a ValueError that names them. The
    rest is the :class:`TaskContext`: RL tasks take ``normalize_observations`` (running observation statistics
    in the policy) and ``compile`` (built-in torch environments: each environment step and the population
    forward as one compiled program); the language-model tasks ``model`` = "hf:DIR" and ``dtype`` (float32,
    bfloat16 or float16: what the model is loaded in)."""
    spec = task_spec(name)
    key = task_key(name)
    foreign = sorted(set(options) - set(TASK_OPTIONS.defaults_of(key)))
    if foreign and TASK_OPTIONS.owners(foreign[0]):
        raise TASK_OPTIONS.refusal(foreign[0], options[foreign[0]], key)
    if foreign:
        raise TypeError(f"make_task got an unknown option {foreign[0]!r}; task {name!r} takes "
                        f"{sorted(TASK_OPTIONS.defaults_of(key)) or 'none'}")
    where = TaskContext(device=device, seed=seed, normalize_observations=normalize_observations, compile=compile,
                        model=model, dtype=dtype)
    return spec.make(name, where, spec.options(**options))  # the task's options check themselves


__all__ = ["ClassificationTask", "Conv1dNet", "DifferentiableTask", "ENVS", "GenerationTask", "GymVectorEnv",
           "ModelMaker", "ObservationNorm", "Policy", "RLTask", "SequenceTask", "SequenceTransformer",
           "StepBatchSampler", "StreamingClassificationTask", "TASKS", "TASK_OPTIONS", "Task", "TaskContext",
           "TaskSpec", "digits", "make_task", "mnist1d", "model_choices", "reverse", "rollout", "sort",
           "supervised_tasks", "task_key", "task_names", "task_spec"]
