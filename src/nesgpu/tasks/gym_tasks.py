"""``gym:<id>``: any gymnasium environment as an RL task, stepped by :class:`~nesgpu.tasks.gym.GymVectorEnv`."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import check_options, option
from .gym import GymVectorEnv
from .gym_warnings import EnvWarnings
from .rl import RLOptions, RLTask
from .spec import TaskOptions, TaskSpec


@dataclass(frozen=True)
class GymOptions(RLOptions):
    """The options of a gym:<id> task: an RL task's, and how its environments are stepped."""

    vector_mode: str = option("sync", "step the envs in this process (sync) or in one subprocess each (async)",
                              choices=("sync", "async"))

    def __post_init__(self):
        check_options(self, "gym:<id> task")


def make_gym_task(name: str, options: TaskOptions) -> RLTask:
    """The RL task of ``gym:<id>``; gymnasium must be able to make ``<id>``."""
    env_id = name[len("gym:"):]
    if not env_id:
        raise ValueError(f"unknown task {name!r}: expected gym:<id>, e.g. gym:Pendulum-v1")
    shown = EnvWarnings()  # the task's environments show each warning once, between them
    try:
        spec = GymVectorEnv.spec(env_id, shown)
    except ImportError:
        raise
    except Exception as e:
        raise ValueError(f"unknown task {name!r}: gymnasium cannot make {env_id!r} ({e})") from e
    clip = options.policy_output != "linear"  # a linear policy's actions reach the env as computed (ARS)
    vector_mode = options.vector_mode
    return RLTask(lambda n, dev: GymVectorEnv(env_id, n, dev, vector_mode=vector_mode, clip_actions=clip,
                                              env_warnings=shown), spec,
                  name, episodes=options.episodes, eval_episodes=options.eval_episodes, device=options.device,
                  seed=options.seed, normalize_observations=options.normalize_observations,
                  reward_shift=options.reward_shift, start_states=options.start_states,
                  policy_output=options.policy_output, observation_clip=options.observation_clip)


# every gym:<id> task starts from these (a linear policy's or a small MLP's; ars-paper presets tune more)
TASKS = {"gym": TaskSpec(make_gym_task, dict(population=64, sigma=0.05, lr=0.02, steps=200, hidden=(32,)),
                         options=GymOptions)}

__all__ = ["TASKS", "make_gym_task"]
