"""The classic-control tasks: the torch-batched environments of :mod:`nesgpu.tasks.envs` as RL tasks."""

from __future__ import annotations

from .envs import ENVS
from .rl import RLOptions, RLTask
from .spec import TaskOptions, TaskSpec


def make_control_task(name: str, options: TaskOptions) -> RLTask:
    """The RL task of the built-in environment ``name``."""
    env_cls = ENVS[name]
    return RLTask(env_cls, env_cls, name, episodes=options.episodes, eval_episodes=options.eval_episodes,
                  device=options.device, seed=options.seed, normalize_observations=options.normalize_observations,
                  compile=options.compile, reward_shift=options.reward_shift, start_states=options.start_states,
                  policy_output=options.policy_output, observation_clip=options.observation_clip)


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
