"""Tasks: rows in, fitness (R, D) out. Supervised datasets, sequence tasks and RL environments.

``TASKS`` is the registry of built-in tasks (each module declares its own, with its tuned defaults): adding
a task is one module plus one line here. Any object meeting :class:`~nesgpu.tasks.protocol.Task` trains too.
"""

from __future__ import annotations

import torch

from . import control, gym_tasks, reward_tasks, sequence, supervised
from .envs import ENVS
from .generation import GenerationTask
from .gym import GymVectorEnv, check_vector_mode
from .protocol import DifferentiableTask, ModelMaker, Task
from .rl import ObservationNorm, Policy, RLTask, rollout
from .sequence import SequenceTask, SequenceTransformer, reverse, sort
from .spec import TaskOptions, TaskSpec
from .streaming import StepBatchSampler, StreamingClassificationTask
from .supervised import ClassificationTask, Conv1dNet, digits, mnist1d

TASKS: dict[str, TaskSpec] = {**supervised.TASKS, **sequence.TASKS, **control.TASKS, **gym_tasks.TASKS,
                              **reward_tasks.TASKS}
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


def make_task(name: str, device: torch.device | str = "cpu", seed: int = 0, batch_size: int = 64,
              episodes: int = 1, eval_episodes: int = 10, vector_mode: str = "sync",
              normalize_observations: bool = True, compile: bool = False, reward_shift: float = 0.0,
              start_states: str = "shared", policy_output: str = "tanh", observation_clip: float | None = 5.0,
              model: str | None = None, dtype: str | None = None):
    """A task by name: "digits", "mnist1d", "reverse", "sort", "cartpole", "pendulum", "acrobot", "mountaincar"
    or "gym:<id>". ``vector_mode`` ("sync" or "async", see :class:`GymVectorEnv`) is for gym:<id> tasks only;
    the others refuse anything but "sync". RL tasks take ``episodes``, ``eval_episodes`` and
    ``normalize_observations`` (running observation statistics in the policy) and ``compile`` (built-in torch
    environments: each environment step and the population forward as one compiled program), and
    ``reward_shift``, ``start_states``, ``policy_output``, ``observation_clip`` (see :class:`RLTask`);
    supervised ones ``batch_size``; the language-model tasks (arithmetic, countdown) ``model`` = "hf:DIR",
    ``dtype`` (float32, bfloat16 or float16: what the model is loaded in) and ``batch_size`` prompts per step."""
    check_vector_mode(vector_mode)
    spec = task_spec(name)
    if vector_mode != "sync" and not name.startswith("gym:"):
        raise ValueError(f"vector_mode={vector_mode!r} applies only to gym:<id> tasks (gymnasium's vector envs); "
                         f"task {name!r} has no gymnasium environment")
    options = TaskOptions(device=device, seed=seed, batch_size=batch_size, episodes=episodes,
                          eval_episodes=eval_episodes, vector_mode=vector_mode,
                          normalize_observations=normalize_observations, compile=compile, reward_shift=reward_shift,
                          start_states=start_states, policy_output=policy_output, observation_clip=observation_clip,
                          model=model, dtype=dtype)
    return spec.make(name, options)


__all__ = ["ClassificationTask", "Conv1dNet", "DifferentiableTask", "ENVS", "GenerationTask", "GymVectorEnv", "MODELS", "ModelMaker",
           "ObservationNorm", "Policy", "RLTask", "SUPERVISED", "SequenceTask", "SequenceTransformer",
           "StepBatchSampler", "StreamingClassificationTask", "TASKS", "TASK_NAMES", "Task", "TaskOptions", "TaskSpec",
           "digits", "make_task", "mnist1d", "model_choices", "reverse", "rollout", "sort", "task_spec"]
