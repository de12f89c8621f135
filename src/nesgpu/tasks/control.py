"""The classic-control tasks: the torch-batched environments of :mod:`nesgpu.tasks.envs` as RL tasks."""

from __future__ import annotations

from .envs import ENVS
from .rl import RLTask
from .rl_options import RLOptions
from .spec import TaskContext, TaskSpec


def make_control_task(name: str, where: TaskContext, options: RLOptions) -> RLTask:
    """The RL task of the built-in environment ``name``."""
    env_cls = ENVS[name]
    return RLTask(env_cls, env_cls, name, device=where.device, seed=where.seed,
                  normalize_observations=where.normalize_observations, compile=where.compile,
                  **options.task_arguments())


def _spec(name: str, **defaults) -> TaskSpec:
    return TaskSpec(make_control_task, defaults, env_steps=ENVS[name].max_steps, options=RLOptions)


# tuned on a 2-core CPU (episodes = start states per member per step); CartPole: PGPE + ClipUp (Toklu et al.
# 2020), which solves it in a few steps
TASKS = {
    "cartpole": _spec("cartpole", strategy="pgpe", population=64, sigma=0.5, lr=0.15, steps=20, hidden=()),
    "pendulum": _spec("pendulum", population=256, sigma=0.5, lr=0.1, steps=300, hidden=(64,), episodes=2),
    "acrobot": _spec("acrobot", population=64, sigma=0.1, lr=0.05, steps=50, hidden=(16,)),
    "mountaincar": _spec("mountaincar", population=64, sigma=0.5, lr=0.05, steps=40, hidden=(16,)),
}

__all__ = ["TASKS", "make_control_task"]
