"""Tasks: rows in, fitness (R, D) out. Supervised datasets, sequence tasks and RL environments.

``TASKS`` is the registry of built-in tasks (each module declares its own, with its tuned defaults): adding
a task is one module plus one line here. Any object meeting :class:`~nesgpu.tasks.protocol.Task` trains too.
"""

from __future__ import annotations

import torch

from ..options import Owners
from ..options import values as options_values
from . import control, dataset_tasks, gym_tasks, reward_tasks, sequence, supervised
from .envs import ENVS
from .generation import GenerationTask
from .gym import GymVectorEnv
from .protocol import DifferentiableTask, ModelMaker, Task
from .rl import ObservationNorm, Policy, RLTask, rollout
from .sequence import SequenceTask, SequenceTransformer, reverse, sort
from .spec import TaskOptions, TaskSpec
from .streaming import StepBatchSampler, StreamingClassificationTask
from .supervised import ClassificationTask, Conv1dNet, digits, mnist1d

TASKS: dict[str, TaskSpec] = {**supervised.TASKS, **sequence.TASKS, **control.TASKS, **gym_tasks.TASKS,
                              **reward_tasks.TASKS, **dataset_tasks.TASKS}
SUPERVISED = {name: spec for name, spec in TASKS.items() if spec.supervised}
TASK_NAMES = [*sorted(SUPERVISED), *sorted(n for n in TASKS if n not in SUPERVISED and n != "gym"), "gym:<id>"]
# every task's options by its registry key, for make_task and the training configuration
TASK_OPTIONS = Owners("task", {name: spec.options for name, spec in TASKS.items()}, labels={"gym": "gym:<id>"})
# model architectures per task (make_model's ``model`` argument); the first is the default
MODELS = {name: spec.models for name, spec in TASKS.items()}


def task_spec(name: str) -> TaskSpec:
    """The registry's entry of a task name (``gym:<id>``: the "gym" entry); a ValueError names the tasks."""
    key = "gym" if name.startswith("gym:") and len(name) > len("gym:") else name
    if key not in TASKS or name == "gym":
        raise ValueError(f"unknown task {name!r}; expected one of {TASK_NAMES}")
    return TASKS[key]


def model_choices(task: str) -> tuple[str, ...]:
    """The architectures ``make_model`` of a task builds; the first is its default (RL tasks: "mlp")."""
    return MODELS.get(task, ("mlp",))


def make_task(name: str, device: torch.device | str = "cpu", seed: int = 0, normalize_observations: bool = True,
              compile: bool = False, model: str | None = None, dtype: str | None = None, **options):
    """A task by name: "digits", "mnist1d", "reverse", "sort", "cartpole", "pendulum", "acrobot", "mountaincar",
    "arithmetic", "countdown" or "gym:<id>". ``options`` are the task's own (its spec's ``options``: the
    supervised and sequence tasks' ``batch_size``; the RL tasks' ``episodes``, ``eval_episodes``,
    ``reward_shift``, ``start_states``, ``policy_output``, ``observation_clip`` (see :class:`RLTask`), and
    gym:<id>'s ``vector_mode`` (see :class:`GymVectorEnv`); the language-model tasks' ``batch_size``, prompts per
    step); an option of other tasks is a ValueError that names them. RL tasks also take
    ``normalize_observations`` (running observation statistics in the policy) and ``compile`` (built-in torch
    environments: each environment step and the population forward as one compiled program); the
    language-model tasks ``model`` = "hf:DIR" and ``dtype`` (float32, bfloat16 or float16: what the model is
    loaded in)."""
    spec = task_spec(name)
    key = "gym" if name.startswith("gym:") else name
    foreign = sorted(set(options) - set(TASK_OPTIONS.defaults_of(key)))
    if foreign and TASK_OPTIONS.owners(foreign[0]):
        raise TASK_OPTIONS.refusal(foreign[0], options[foreign[0]], key)
    if foreign:
        raise TypeError(f"make_task got an unknown option {foreign[0]!r}; task {name!r} takes "
                        f"{sorted(TASK_OPTIONS.defaults_of(key)) or 'none'}")
    values = options_values(spec.options(**options))  # the task's options check themselves
    if values.get("policy_output") == "auto":  # resolved by the training config; a task alone squashes
        values["policy_output"] = "tanh"
    if "observation_clip" in values:
        values["observation_clip"] = values["observation_clip"] or None  # 0: none
    context = TaskOptions(device=device, seed=seed, normalize_observations=normalize_observations, compile=compile,
                          model=model, dtype=dtype, **values)
    return spec.make(name, context)


__all__ = ["ClassificationTask", "Conv1dNet", "DifferentiableTask", "ENVS", "GenerationTask", "GymVectorEnv", "MODELS",
           "ModelMaker", "ObservationNorm", "Policy", "RLTask", "SUPERVISED", "SequenceTask", "SequenceTransformer",
           "StepBatchSampler", "StreamingClassificationTask", "TASKS", "TASK_NAMES", "TASK_OPTIONS", "Task",
           "TaskOptions", "TaskSpec", "digits", "make_task", "mnist1d", "model_choices", "reverse", "rollout", "sort",
           "task_spec"]
