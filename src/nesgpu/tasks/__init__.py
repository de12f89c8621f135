"""Tasks: rows in, fitness (R, D) out. Supervised datasets, sequence tasks and RL environments.

``TASKS`` is the registry of built-in tasks (each module declares its own, with its tuned defaults): adding
a task is one module plus one line here. Any object meeting :class:`~nesgpu.tasks.protocol.Task` trains too.
"""

from __future__ import annotations

import dataclasses

import torch

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
    own = {f.name for f in dataclasses.fields(spec.options)}
    foreign = sorted(set(options) - own)
    if foreign:
        theirs = sorted(n if n != "gym" else "gym:<id>" for n, s in TASKS.items()
                        if foreign[0] in {f.name for f in dataclasses.fields(s.options)})
        raise ValueError(f"option {foreign[0]!r} (= {options[foreign[0]]!r}) applies to task "
                         f"{' or '.join(map(repr, theirs)) or 'none'}, not to task {name!r}; its options: "
                         f"{sorted(own) or 'none'}")
    values = dataclasses.asdict(spec.options(**options))  # the task's options check themselves
    if values.get("policy_output") == "auto":  # resolved by the training config; a task alone squashes
        values["policy_output"] = "tanh"
    if "observation_clip" in values:
        values["observation_clip"] = values["observation_clip"] or None  # 0: none
    context = TaskOptions(device=device, seed=seed, normalize_observations=normalize_observations, compile=compile,
                          model=model, dtype=dtype, **values)
    return spec.make(name, context)


__all__ = ["ClassificationTask", "Conv1dNet", "DifferentiableTask", "ENVS", "GenerationTask", "GymVectorEnv", "MODELS",
           "ModelMaker", "ObservationNorm", "Policy", "RLTask", "SUPERVISED", "SequenceTask", "SequenceTransformer",
           "StepBatchSampler", "StreamingClassificationTask", "TASKS", "TASK_NAMES", "Task", "TaskOptions", "TaskSpec",
           "digits", "make_task", "mnist1d", "model_choices", "reverse", "rollout", "sort", "task_spec"]
