"""Any gymnasium environment (``gym:<id>``) as a batched environment, through gymnasium's vector API.

Warnings. Environments can warn at every reset or step, in every row: gymnasium's environment checker on each
row's first reset and step, MuJoCo's C library (``mju_warning``: at each model compile, e.g. HalfCheetah-v5's
"compiler attribute 'settotalmass' is deprecated", and at instabilities, "Nan, Inf or huge value in QACC ..."),
or the environment's own code. Inside this module's calls into the environment only (creation, reset, step),
a warning whose category and text have been shown once in this process is not shown again, even under an
"always" filter; everything else about the user's filters holds ("error" raises, "ignore" drops). MuJoCo's
messages arrive as :class:`MujocoWarning` (module "mujoco", so ``-W "ignore:::mujoco"`` silences them) instead
of being printed and appended to ``MUJOCO_LOG.TXT`` in the working directory, unless the process has a
``mujoco.set_mju_user_warning`` handler of its own. Under ``vector_mode="async"`` the rows' warnings are
raised in the worker processes; they are recorded there and shown here, by the same rules, under the filters
in force at the reset or step that brings them (a worker's creation warnings come with its first reset).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import re
import sys
import warnings
import weakref
from typing import TYPE_CHECKING

import torch

from ..noise import derive_seed

if TYPE_CHECKING:  # numpy comes with gymnasium (the [rl] extra): imported where an environment runs
    import numpy as np

VECTOR_MODES = ("sync", "async")
_WARNINGS_KEY = "nesgpu_warnings"  # info key that carries a worker's warnings to the main process
_SHOWN: set[tuple[type, str]] = set()  # (category, text) of every warning shown from inside an environment call
_MUJOCO_TIME = re.compile(r"\s*Time = [-+0-9.eE]+\.?\s*$")  # MuJoCo's instability messages end with the time


class MujocoWarning(UserWarning):
    """A message of MuJoCo's C library (``mju_warning``) raised while a gym environment was created, reset or
    stepped."""


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


def _dedup_key(category: type, text: str) -> tuple[type, str]:
    if issubclass(category, MujocoWarning):
        text = _MUJOCO_TIME.sub("", text)
    return category, text


class _ShowOnce:
    """Context for a call into the environment in this (the main) process: a warning shown inside it is shown
    only if its category and text were not shown inside such a call before; MuJoCo's messages become
    :class:`MujocoWarning`. Filters are left alone (``warnings.catch_warnings`` would reset every module's
    "default" registry at each step), only ``warnings.showwarning`` is swapped for the call. Nests."""

    __slots__ = ("_hook_mujoco", "_messages", "_mujoco", "_previous")

    def __init__(self, mujoco: bool = True):
        self._hook_mujoco = mujoco

    def __enter__(self):
        self._previous = warnings.showwarning
        if not isinstance(self._previous, _OnceShower):
            warnings.showwarning = _OnceShower(self._previous)
        self._mujoco = sys.modules.get("mujoco") if self._hook_mujoco else None
        self._messages = _catch_mujoco_messages(self._mujoco)  # a handler set before (the process's) stays
        return self

    def __exit__(self, *exc):
        try:
            if self._messages is not None:
                self._mujoco.set_mju_user_warning(None)
                for text in self._messages:
                    _warn_mujoco(text)
        finally:
            warnings.showwarning = self._previous
        return False


class _OnceShower:
    """``warnings.showwarning`` inside :class:`_ShowOnce`: passes on what was not shown before."""

    __slots__ = ("show",)

    def __init__(self, show):
        self.show = show

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        key = _dedup_key(category, str(message))
        if key in _SHOWN:
            return
        _SHOWN.add(key)
        self.show(message, category, filename, lineno, file, line)


def _catch_mujoco_messages(mujoco) -> list[str] | None:
    """Route MuJoCo's C-level warning messages into a new list (returned) while no other handler is set;
    None (nothing routed) when mujoco is not loaded or a handler is already in place."""
    get = getattr(mujoco, "get_mju_user_warning", None)
    if get is None or get() is not None:
        return None
    messages: list[str] = []
    mujoco.set_mju_user_warning(messages.append)
    return messages


def _warn_mujoco(text: str) -> None:
    warnings.warn_explicit(text, MujocoWarning, "mujoco", 0, module="mujoco", registry=_MUJOCO_REGISTRY)


_MUJOCO_REGISTRY: dict = {}
_FORWARDED_REGISTRY: dict = {}


class _Record:
    """Context for a call into the environment in an async worker: records every warning (filters are the main
    process's business) and every MuJoCo message, to travel to the main process in the call's info."""

    def __init__(self):
        self.caught: list[tuple] = []

    def __enter__(self):
        self._catch = warnings.catch_warnings(record=True)
        self._log = self._catch.__enter__()
        warnings.simplefilter("always")
        self._mujoco = sys.modules.get("mujoco")
        self._messages = _catch_mujoco_messages(self._mujoco)  # the worker's own (fork copies none)
        return self

    def __exit__(self, *exc):
        try:
            if self._messages is not None:
                self._mujoco.set_mju_user_warning(None)
                self.caught += [(MujocoWarning, text, "mujoco", 0, "mujoco") for text in self._messages]
        finally:
            self._catch.__exit__(*exc)
        for w in self._log:
            category = w.category
            try:
                pickle.dumps(category)
            except Exception:  # a class the main process may not be able to load
                category = UserWarning
            self.caught.append((category, str(w.message), w.filename, w.lineno, _module_of(w.filename)))
        return False


@functools.lru_cache(maxsize=256)
def _module_of(filename: str) -> str | None:
    """The name of the imported module in ``filename`` (what warning filters match), or None."""
    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name
    return None


def _make_env(env_id: str, main_pid: int):
    """One row's environment. In an async worker it is wrapped to send its warnings along with its resets and
    steps (the creation's with the first reset); in the main process (AsyncVectorEnv makes one there to read
    the spaces) it is made under the main process's rules."""
    import gymnasium as gym

    if os.getpid() == main_pid:
        with _ShowOnce():
            return gym.make(env_id)
    with _Record() as record:
        env = gym.make(env_id)
    return _send_warnings_wrapper()(env, record.caught)


@functools.cache
def _send_warnings_wrapper():
    """The gymnasium wrapper of an async worker's environment (built on first use: gymnasium is optional)."""
    import gymnasium as gym

    class SendWarnings(gym.Wrapper):
        def __init__(self, env, pending):
            super().__init__(env)
            self._pending = list(pending)

        def _attach(self, info, record):
            caught = self._pending + record.caught
            self._pending = []
            if caught:
                info = dict(info)
                info[_WARNINGS_KEY] = caught
            return info

        def reset(self, **kwargs):
            with _Record() as record:
                obs, info = self.env.reset(**kwargs)
            return obs, self._attach(info, record)

        def step(self, action):
            with _Record() as record:
                obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, reward, terminated, truncated, self._attach(info, record)

    return SendWarnings


def _show_forwarded(info: dict) -> None:
    """Raise, in this process, the warnings the async workers recorded (inside a :class:`_ShowOnce`)."""
    caught, mask = info.get(_WARNINGS_KEY), info.get("_" + _WARNINGS_KEY)
    if caught is None:
        return
    for row, records in enumerate(caught):
        if mask is not None and not mask[row]:
            continue
        for category, text, filename, lineno, module in records or ():
            registry = _MUJOCO_REGISTRY if category is MujocoWarning else _FORWARDED_REGISTRY
            warnings.warn_explicit(text, category, filename, lineno, module=module, registry=registry)


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
                 clip_actions: bool = True):
        try:
            import gymnasium as gym
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("gym:<id> tasks need gymnasium: pip install 'nesgpu[rl]'") from e
        self.vector_mode = check_vector_mode(vector_mode)
        self.clip_actions = clip_actions  # False: continuous actions reach the env as computed (ARS's linear policy)
        self.env_id, self.n, self.device = env_id, n, torch.device(device)
        _import_mujoco_for(env_id)
        if vector_mode == "sync":
            with _ShowOnce():
                self.env = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
        else:  # no MuJoCo hook while forking: the workers would inherit it (_make_env hooks its own)
            with _ShowOnce(mujoco=False):
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
    def spec(env_id: str):
        """Spaces of ``env_id`` in the form RLTask expects."""
        import gymnasium as gym
        import numpy as np
        _import_mujoco_for(env_id)
        with _ShowOnce():
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
        with _ShowOnce():
            obs, info = self.env.reset(seed=seeds)
            _show_forwarded(info)
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
        with _ShowOnce():
            if self.vector_mode == "sync":
                obs, reward, done = self._step_running(a)
            else:
                obs, reward, terminated, truncated, info = self.env.step(a)
                _show_forwarded(info)
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


def _import_mujoco_for(env_id: str) -> None:
    """Import mujoco ahead of a MuJoCo environment's creation, so that its compile messages (one per row) are
    caught too: :class:`_ShowOnce` only hooks a mujoco that is already imported."""
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
