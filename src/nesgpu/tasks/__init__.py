"""Tasks: rows in, fitness (R, D) out. Supervised datasets and RL environments."""

from __future__ import annotations

import torch

from .envs import ENVS
from .gym import GymVectorEnv
from .rl import ObservationNorm, Policy, RLTask, rollout
from .sequence import SequenceTask, SequenceTransformer, reverse, sort
from .streaming import StepBatchSampler, StreamingClassificationTask
from .supervised import ClassificationTask, Conv1dNet, digits, mnist1d

SUPERVISED = {"digits": digits, "mnist1d": mnist1d, "reverse": reverse, "sort": sort}
TASK_NAMES = sorted(SUPERVISED) + sorted(ENVS) + ["gym:<id>"]
# model architectures per task (make_model's ``model`` argument); the first is the default
MODELS = {"digits": ("mlp",), "mnist1d": ("mlp", "cnn"), "reverse": ("transformer",), "sort": ("transformer",)}


def model_choices(task: str) -> tuple[str, ...]:
    """The architectures ``make_model`` of a task builds; the first is its default (RL tasks: "mlp")."""
    return MODELS.get(task, ("mlp",))


def make_task(name: str, device: torch.device | str = "cpu", seed: int = 0, batch_size: int = 64,
              episodes: int = 1, eval_episodes: int = 10, vector_mode: str = "sync",
              normalize_observations: bool = True, compile: bool = False, reward_shift: float = 0.0,
              start_states: str = "shared", policy_output: str = "tanh", observation_clip: float | None = 5.0):
    """A task by name: "digits", "mnist1d", "reverse", "sort", "cartpole", "pendulum", "acrobot", "mountaincar"
    or "gym:<id>". ``vector_mode`` ("sync" or "async", see :class:`GymVectorEnv`) is for gym:<id> tasks only;
    the others refuse anything but "sync". RL tasks take ``episodes``, ``eval_episodes`` and
    ``normalize_observations`` (running observation statistics in the policy) and ``compile`` (built-in torch
    environments: each environment step and the population forward as one compiled program), and
    ``reward_shift``, ``start_states``, ``policy_output``, ``observation_clip`` (see :class:`RLTask`);
    supervised ones ``batch_size``."""
    from .gym import check_vector_mode

    check_vector_mode(vector_mode)
    if vector_mode != "sync" and (name in SUPERVISED or name in ENVS):
        raise ValueError(f"vector_mode={vector_mode!r} applies only to gym:<id> tasks (gymnasium's vector envs); "
                         f"task {name!r} has no gymnasium environment")
    rl_options = dict(reward_shift=reward_shift, start_states=start_states, policy_output=policy_output,
                      observation_clip=observation_clip)
    if name in SUPERVISED:
        return SUPERVISED[name](device=device, seed=seed, batch_size=batch_size)
    if name in ENVS:
        env_cls = ENVS[name]
        return RLTask(env_cls, env_cls, name, episodes=episodes, eval_episodes=eval_episodes, device=device,
                      seed=seed, normalize_observations=normalize_observations, compile=compile, **rl_options)
    if name.startswith("gym:") and len(name) > 4:
        env_id = name[4:]
        try:
            spec = GymVectorEnv.spec(env_id)
        except ImportError:
            raise
        except Exception as e:
            raise ValueError(f"unknown task {name!r}: gymnasium cannot make {env_id!r} ({e})") from e
        clip = policy_output != "linear"  # a linear policy's actions reach the env as computed (ARS)
        return RLTask(lambda n, dev: GymVectorEnv(env_id, n, dev, vector_mode=vector_mode, clip_actions=clip), spec,
                      name, episodes=episodes, eval_episodes=eval_episodes, device=device, seed=seed,
                      normalize_observations=normalize_observations, **rl_options)
    raise ValueError(f"unknown task {name!r}; expected one of {TASK_NAMES}")


__all__ = ["StepBatchSampler", "StreamingClassificationTask", "ClassificationTask", "Conv1dNet", "ENVS", "GymVectorEnv",
           "MODELS", "ObservationNorm", "Policy", "RLTask", "SequenceTask", "SequenceTransformer", "TASK_NAMES",
           "digits", "make_task", "mnist1d", "model_choices", "reverse", "rollout", "sort"]
