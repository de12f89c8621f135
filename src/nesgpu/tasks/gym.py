"""Any gymnasium environment (``gym:<id>``) as a batched environment, through gymnasium's vector API.

Warnings the environments raise at every reset or step, in every row, are shown once per task: the
environments of a task share one :class:`~nesgpu.tasks.gym_warnings.EnvWarnings` (see that module).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import weakref
from typing import TYPE_CHECKING

import torch

from ..noise import derive_seed
from .gym_warnings import WARNINGS_KEY, EnvWarnings, MujocoWarning, Recorder
from .user_code import env_module, import_module

if TYPE_CHECKING:  # numpy comes with gymnasium (the [rl] extra): imported where an environment runs
    import numpy as np

VECTOR_MODES = ("sync", "async")


def check_vector_mode(vector_mode: str) -> str:
    """``vector_mode`` if it is one of :data:`VECTOR_MODES`, else ValueError."""
    if vector_mode not in VECTOR_MODES:
        raise ValueError(f"vector_mode must be one of {VECTOR_MODES}; got {vector_mode!r}")
    return vector_mode


def _async_context() -> str | None:
    """The multiprocessing start method of async workers: "fork" on Linux, elsewhere the platform default
    (spawn on macOS and Windows).

    A forked worker starts in milliseconds and needs no ``if __name__ == "__main__"`` guard in the user's
    script. The workers run only the environment (gymnasium, numpy, MuJoCo), never torch, whose CUDA and OpenMP
    a forked child cannot use. (Python 3.12+'s DeprecationWarning about forking a process with threads is hidden
    by the default filters, and shown once under "always".) "forkserver" (Python 3.14's Linux default) and
    "spawn" import the environment's modules, spawn the whole main script too, in each of the n workers: for
    64 HalfCheetah rows on two cores, 110 s (spawn) and 230 s (forkserver) to start, against 2 to 4 s forked.
    """
    return "fork" if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods() else None


def _make_env(env_id: str, main_pid: int):
    """One row's environment. In an async worker it is wrapped to send its warnings along with its resets and
    steps (the creation's with the first reset); in the main process (AsyncVectorEnv makes one there to read
    the spaces) it is made under the main process's rules."""
    import gymnasium as gym

    import_env_module(env_id)  # a spawned worker (macOS, Windows) imports it anew
    if os.getpid() == main_pid:
        with EnvWarnings().call():
            return gym.make(env_id)
    modules: dict[str, str | None] = {}  # the worker's filename -> module table
    with Recorder(modules) as record:
        env = gym.make(env_id)
    return _send_warnings(env, record.caught, modules)


def _send_warnings(env, pending: list, modules: dict):
    """``env`` (in an async worker) wrapped so that its resets and steps carry their warnings in their info."""
    import gymnasium as gym

    class SendWarnings(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self._pending = list(pending)

        def _attach(self, info, record):
            caught = self._pending + record.caught
            self._pending = []
            if caught:
                info = dict(info)
                info[WARNINGS_KEY] = caught
            return info

        def reset(self, **kwargs):
            with Recorder(modules) as record:
                obs, info = self.env.reset(**kwargs)
            return obs, self._attach(info, record)

        def step(self, action):
            with Recorder(modules) as record:
                obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, reward, terminated, truncated, self._attach(info, record)

    return SendWarnings(env)


def _close(env, pid: int) -> None:
    """Close a vector env (its worker processes too), only from the process that made it (a forked child holds
    a copy of the object, not the workers)."""
    if os.getpid() != pid or getattr(env, "closed", True):
        return
    try:
        env.close()
    except Exception:  # a worker already gone (interpreter exit, a crash): make sure none is left
        try:
            env.close(terminate=True)
        except Exception:
            pass


class GymVectorEnv:
    """n copies of a gymnasium environment in a vector env, with torch tensors in and out.

    Rows of the same group start from the same seed (so from the same state). Each row runs one episode
    from a reset: in sync mode a row whose episode has ended is no longer stepped (it reports done, reward
    0 and its last observation); in async mode gymnasium resets it on the next step and the rollout ignores
    everything after the first episode.

    ``vector_mode``: "sync" steps the rows one after another in this process (gymnasium's SyncVectorEnv);
    "async" steps each row in its own worker process (AsyncVectorEnv; forked on Linux, see
    :func:`_async_context`), for environments whose step costs more than the inter-process round trip.
    Both give the same returns for the same policy. :meth:`close` ends the workers; so does dropping the
    object (or the end of the interpreter).
    """

    def __init__(self, env_id: str, n: int, device: torch.device | str = "cpu", vector_mode: str = "sync",
                 clip_actions: bool = True, env_warnings: EnvWarnings | None = None):
        try:
            import gymnasium as gym
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("gym:<id> tasks need gymnasium: pip install 'nesgpu[rl]'") from e
        self.vector_mode = check_vector_mode(vector_mode)
        self.clip_actions = clip_actions  # False: continuous actions reach the env as computed (ARS's linear policy)
        self.env_id, self.n, self.device = env_id, n, torch.device(device)
        self.warnings = env_warnings or EnvWarnings()  # what this env's calls have shown (shared by a task's envs)
        import_env_module(env_id)
        _import_mujoco_for(env_id)
        if vector_mode == "sync":
            with self.warnings.call():
                self.env = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
        else:  # no MuJoCo hook while forking: the workers would inherit it (_make_env hooks its own)
            with self.warnings.call(mujoco=False):
                self.env = gym.vector.AsyncVectorEnv(
                    [functools.partial(_make_env, env_id, os.getpid()) for _ in range(n)], context=_async_context())
        self._finalizer = weakref.finalize(self, _close, self.env, os.getpid())
        space = self.env.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self._low = None if self.discrete else space.low
        self._high = None if self.discrete else space.high

    def close(self) -> None:
        """End the environments (and the worker processes of async mode). Safe to call more than once."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @staticmethod
    def spec(env_id: str, env_warnings: EnvWarnings | None = None):
        """Spaces of ``env_id`` in the form RLTask expects (the env's warnings shown through ``env_warnings``)."""
        import gymnasium as gym
        import numpy as np
        import_env_module(env_id)
        _import_mujoco_for(env_id)
        with (env_warnings or EnvWarnings()).call():
            env = gym.make(env_id)
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(f"gym:{env_id} needs a flat Box observation space; got {obs_space}")
        discrete = isinstance(act_space, gym.spaces.Discrete)
        if not discrete and not (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1):
            raise ValueError(f"gym:{env_id} needs a Discrete or flat Box action space; got {act_space}")
        high = 1.0 if discrete else float(np.max(np.abs(np.concatenate([act_space.low, act_space.high]))))
        max_steps = env.spec.max_episode_steps or 1000
        env.close()  # reward_threshold: the return at which gymnasium calls the task solved (or None)
        return type("GymSpec", (), dict(
            obs_dim=obs_space.shape[0], discrete=discrete, num_actions=int(act_space.n) if discrete else 0,
            action_dim=0 if discrete else act_space.shape[0], action_high=high, max_steps=max_steps,
            reward_threshold=env.spec.reward_threshold))

    def reset(self, seed: int, groups: torch.Tensor, count: int) -> torch.Tensor:
        import numpy as np
        seeds = [derive_seed(seed, g) % 2**31 for g in groups.tolist()]
        with self.warnings.call():
            obs, info = self.env.reset(seed=seeds)
            self.warnings.show_forwarded(info)
        self._obs = np.array(obs)
        self._ended = np.zeros(self.n, dtype=bool)
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device)

    def step(self, action: torch.Tensor):
        import numpy as np
        a = action.detach().cpu().numpy()
        if self.discrete:
            a = a.astype(np.int64)
        else:
            a = np.clip(a.astype(np.float32), self._low, self._high) if self.clip_actions else a.astype(np.float32)
        with self.warnings.call():
            if self.vector_mode == "sync":
                obs, reward, done = self._step_running(a)
            else:
                obs, reward, terminated, truncated, info = self.env.step(a)
                self.warnings.show_forwarded(info)
                done = np.logical_or(terminated, truncated)
        return (torch.as_tensor(obs, dtype=torch.float32, device=self.device),
                torch.as_tensor(reward, dtype=torch.float64, device=self.device),
                torch.as_tensor(done, device=self.device))

    def _step_running(self, a: np.ndarray):
        """Sync mode: step only the rows whose episode is still running (a rollout ignores a row after its
        episode ends, so a fallen Hopper costs no simulation); ended rows repeat their last observation with
        reward 0 and done."""
        import numpy as np
        reward = np.zeros(self.n)
        for i in np.flatnonzero(~self._ended):
            obs, reward[i], terminated, truncated, _ = self.env.envs[i].step(a[i])
            self._obs[i] = obs
            self._ended[i] = terminated or truncated
        return self._obs.copy(), reward, self._ended.copy()


def import_env_module(env_id: str) -> None:
    """The module of a ``module:Env-v0`` id, imported as a user's own module is (the working directory first,
    for that import only), before gymnasium's own import of it finds it loaded; a ValueError if it cannot be."""
    module = env_module(env_id)
    if module is not None:
        import_module(module, f"gym:{env_id}")


def _import_mujoco_for(env_id: str) -> None:
    """Import mujoco ahead of a MuJoCo environment's creation, so that its compile messages (one per row) are
    caught too: :class:`~nesgpu.tasks.gym_warnings.ShowOnce` only hooks a mujoco that is already imported."""
    if "mujoco" in sys.modules:
        return
    try:
        import gymnasium as gym
        entry_point = gym.spec(env_id).entry_point
    except Exception:  # an unknown id: gym.make raises the informative error
        return
    if "mujoco" in (entry_point if isinstance(entry_point, str) else getattr(entry_point, "__module__", "")).lower():
        try:
            import mujoco  # noqa: F401
        except ImportError:
            pass


__all__ = ["GymVectorEnv", "MujocoWarning", "VECTOR_MODES", "check_vector_mode", "import_env_module"]
