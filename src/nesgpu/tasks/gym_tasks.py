"""``gym:<id>``: any gymnasium environment as an RL task, stepped by :class:`~nesgpu.tasks.gym.GymVectorEnv`."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import check_options, option
from .gym import GymVectorEnv
from .gym_warnings import EnvWarnings
from .rendering import rendering_failure
from .rl import RLTask
from .rl_options import RLOptions
from .spec import TaskContext, TaskSpec


@dataclass(frozen=True)
class GymOptions(RLOptions):
    """The options of a gym:<id> task: an RL task's, and how its environments are stepped."""

    vector_mode: str = option("sync", "step the envs in this process (sync) or in one subprocess each (async)",
                              choices=("sync", "async"))

    def __post_init__(self):
        check_options(self, "gym:<id> task")


def make_gym_task(name: str, where: TaskContext, options: GymOptions) -> RLTask:
    """The RL task of ``gym:<id>``; gymnasium must be able to make ``<id>``."""
    env_id = name[len("gym:"):]
    if not env_id:
        raise ValueError(f"unknown task {name!r}: expected gym:<id>, e.g. gym:Pendulum-v1")
    shown = EnvWarnings()  # the task's environments show each warning once, between them
    try:
        spec = GymVectorEnv.spec(env_id, shown)
    except Exception as e:
        failure = rendering_failure(e, name)  # MUJOCO_GL's backend, not the task: gymnasium imports the renderer
        if failure:
            raise ValueError(failure) from e
        if isinstance(e, ImportError):
            raise
        raise ValueError(f"unknown task {name!r}: gymnasium cannot make {env_id!r} ({e})") from e
    arguments = options.task_arguments()
    clip = arguments["policy_output"] != "linear"  # a linear policy's actions reach the env as computed (ARS)
    vector_mode = options.vector_mode
    return RLTask(lambda n, dev: GymVectorEnv(env_id, n, dev, vector_mode=vector_mode, clip_actions=clip,
                                              env_warnings=shown), spec,
                  name, device=where.device, seed=where.seed, normalize_observations=where.normalize_observations,
                  **arguments)


# every gym:<id> task starts from these (a linear policy's or a small MLP's; ars-paper presets tune more)
TASKS = {"gym": TaskSpec(make_gym_task, dict(population=64, sigma=0.05, lr=0.02, steps=200, hidden=(32,)),
                         options=GymOptions)}

__all__ = ["TASKS", "make_gym_task"]
