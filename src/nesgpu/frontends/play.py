"""``nesgpu play``: run a trained RL policy for a few episodes, and optionally film it.

Without ``--video`` the episodes run in the run's own environment, batched, exactly as ``nesgpu eval`` runs
them (the same start states for the same seed). With ``--video`` they run one at a time in a gymnasium
environment made with ``render_mode="rgb_array"``: a ``gym:<id>`` task's own environment, or the gymnasium
twin of a built-in torch environment (the same dynamics, observation layout and action meaning; the tests in
``tests/tasks/test_envs.py`` compare them step for step), started from the same states.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from ..tasks.rendering import rendering_errors
from .run_code import add_trust_flag, consent_to_run_code

VIDEO_SUFFIXES = (".mp4", ".gif")
PLAY_EXTRA = "pip install 'nesgpu[play]'"
# built-in environments whose gymnasium twin (``ENVS[name].gym_id``) was checked against ours: same state,
# observation order and scaling, same action meaning (discrete ids; continuous torque / force in the same
# units), same rewards and termination. A built-in environment not listed here cannot be filmed.
VERIFIED_TWINS = frozenset({"cartpole", "pendulum", "acrobot", "mountaincar"})


def _check_episodes(episodes) -> int:
    if isinstance(episodes, bool) or not isinstance(episodes, int):
        raise TypeError(f"episodes must be an int; got {episodes!r}")
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1; got {episodes}")
    return episodes


def _check_video(video) -> Path | None:
    if video is None:
        return None
    path = Path(video)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise ValueError(f"video {str(video)!r}: expected a file ending in {' or '.join(VIDEO_SUFFIXES)}")
    if path.is_dir():
        raise ValueError(f"video {str(video)!r} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise ValueError(f"video {str(video)!r}: the directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"video {str(video)!r}: cannot write there (permission denied)")
    return path


def _run_task_name(directory: Path) -> str | None:
    """The task named in a run directory's config.json, when it can be read (load_run reports the errors)."""
    from ..files import read_json

    try:
        return read_json(directory / "config.json").get("task")
    except (OSError, ValueError, AttributeError):
        return None


def _rl_task_names() -> list[str]:
    """The built-in RL tasks (those with RL options: the torch environments and gym:<id>), as play names them."""
    from ..tasks import TASKS
    from ..tasks.rl_options import RLOptions

    return [f"{n}:<id>" if n == "gym" else n for n, spec in TASKS.items() if issubclass(spec.options, RLOptions)]


def _is_other_task(task: str | None) -> bool:
    """Whether ``task`` (a run's config.json) is a built-in task that is not RL: refused before any model is
    built or loaded. An unknown or custom task is left to load_run and the check after it."""
    from ..tasks import TASKS
    from ..tasks.rl_options import RLOptions

    return isinstance(task, str) and task in TASKS and not issubclass(TASKS[task].options, RLOptions)


def _not_rl(directory: Path, task: str | None) -> ValueError:
    from ..tasks import supervised_tasks

    kind = "supervised " if task in supervised_tasks() else ""
    return ValueError(f"play is for RL runs; use nesgpu eval ({directory} is a run of the {kind}task {task!r}; "
                      f"play needs a run of an RL task: {', '.join(_rl_task_names())})")


def _twin_id(task_name: str) -> str:
    """The gymnasium id that films a task: a gym task's own id, or a built-in environment's verified twin."""
    from ..tasks.envs import ENVS

    if task_name.startswith("gym:"):
        return task_name[4:]
    if task_name in ENVS and task_name in VERIFIED_TWINS:
        return ENVS[task_name].gym_id
    raise ValueError(f"--video is not available for {task_name!r}: it has no gymnasium twin with the same "
                     f"observations and actions to render it")


class _VideoWriter:
    """Frames (H, W, 3) uint8 to an mp4 (imageio + imageio-ffmpeg, streamed) or a gif (Pillow; frames are kept,
    palettised, until the end)."""

    def __init__(self, path: Path, fps: float):
        self.path, self.fps, self.frames = path, fps, 0
        self._gif = path.suffix.lower() == ".gif"
        if self._gif:
            try:
                from PIL import Image
            except ImportError as e:
                raise ImportError(f"--video .gif needs Pillow: {PLAY_EXTRA}") from e
            self._image, self._kept = Image, []
        else:
            try:
                import imageio.v2 as imageio
                import imageio_ffmpeg  # noqa: F401  (imageio's mp4 backend)
            except ImportError as e:
                raise ImportError(f"--video .mp4 needs imageio and imageio-ffmpeg: {PLAY_EXTRA}") from e
            # the classic-control frames have even sizes, which yuv420p needs; no resizing to multiples of 16
            self._writer = imageio.get_writer(str(path), format="FFMPEG", mode="I", fps=fps, macro_block_size=2)

    def add(self, frame) -> None:
        if self._gif:
            image = self._image.fromarray(frame).convert("RGB")  # fast octree: ~5x faster than median cut
            self._kept.append(image.quantize(colors=256, method=self._image.Quantize.FASTOCTREE))
        else:
            self._writer.append_data(frame)
        self.frames += 1

    def close(self) -> None:
        if not self._gif:
            self._writer.close()
        elif self._kept:
            # gif delays are in hundredths of a second; Pillow merges identical consecutive frames
            duration = max(20, round(1000 / self.fps / 10) * 10)
            self._kept[0].save(self.path, save_all=True, append_images=self._kept[1:], duration=duration, loop=0)
            self._kept = []

    def abort(self) -> None:
        try:
            if not self._gif:
                self._writer.close()
        finally:
            self._kept = []
            self.path.unlink(missing_ok=True)


def _make_gym(env_id: str, render: bool):
    try:
        import gymnasium as gym
    except ImportError as e:
        raise ImportError(f"--video needs gymnasium: {PLAY_EXTRA}") from e
    if render and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # rgb_array frames need no window; keeps SDL quiet
    try:
        return gym.make(env_id, render_mode="rgb_array" if render else None)
    except ImportError as e:  # classic control renders with pygame, MuJoCo with mujoco
        raise ImportError(f"rendering {env_id} needs a package that is missing ({e}): {PLAY_EXTRA}") from e


def gym_episodes(task, model, episodes: int, seed: int, writer: _VideoWriter | None = None,
                 env=None) -> tuple[list[float], list[int]]:
    """Run the plain policy ``model`` for ``episodes`` episodes, one at a time, in the gymnasium environment of
    ``task`` (its own for ``gym:<id>``, the verified twin for a built-in one), from the start states that
    :meth:`RLTask.evaluate` uses for ``seed``; every frame goes to ``writer`` if given.
    Returns (returns, lengths)."""
    import numpy as np
    import torch

    from ..noise import derive_seed
    from ..tasks.rl import EVAL_STREAM

    base = derive_seed(seed, EVAL_STREAM)
    builtin = not task.name.startswith("gym:")
    if env is None:
        env = _make_gym(_twin_id(task.name), writer is not None)
    starts = None
    if builtin:  # the states our batched rollout starts from (drawn on the task's device, as it draws them)
        ours = task.make_env(episodes, task.device)
        ours.reset(base, torch.arange(episodes, device=task.device), episodes)
        starts = ours.state.detach().cpu().numpy()
    space = env.action_space
    discrete = hasattr(space, "n")
    device = next((p.device for p in model.parameters()), task.device)
    returns, lengths = [], []
    for e in range(episodes):
        obs, _ = env.reset(seed=derive_seed(base, e) % 2**31)
        if starts is not None:
            unwrapped = env.unwrapped
            unwrapped.state = starts[e].astype(np.asarray(unwrapped.state).dtype)
            probe = task.make_env(1, "cpu")  # the first observation of that state, as our env observes it
            probe.state = torch.as_tensor(starts[e:e + 1], dtype=torch.float64)
            obs = probe.observe()[0].numpy()
        if writer is not None:
            writer.add(env.render())
        total, length = 0.0, 0
        for _ in range(task.max_steps):
            x = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device).unsqueeze(0)
            action = model(x)[0].float().cpu().numpy()
            if discrete:
                action = int(action)
            elif builtin:  # our envs take the policy's action as it is (its bound is the space's)
                action = action.astype(np.float32).reshape(space.shape)
            else:  # as GymVectorEnv passes it
                action = np.clip(action.astype(np.float32).reshape(space.shape), space.low, space.high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            length += 1
            if writer is not None:
                writer.add(env.render())
            if terminated or truncated:
                break
        returns.append(total)
        lengths.append(length)
    return returns, lengths


def _batched_episodes(task, model, episodes: int, seed: int) -> tuple[list[float], list[int]]:
    """The episodes at once in the run's own environment, from the start states evaluate() uses."""
    import torch

    from ..noise import derive_seed
    from ..tasks.rl import EVAL_STREAM, rollout

    groups = torch.arange(episodes, device=task.device)
    totals, steps, _ = rollout(task.make_env(episodes, task.device), model, groups, derive_seed(seed, EVAL_STREAM),
                               task.max_steps)
    return totals.tolist(), steps.tolist()


def _recorded_episodes(task, model, episodes: int, seed: int, path: Path):
    """The episodes one at a time in a rendering gymnasium environment, every frame written to ``path``:
    (returns, lengths, where they ran, the writer)."""
    env_id = _twin_id(task.name)
    env = _make_gym(env_id, render=True)
    try:
        writer = _VideoWriter(path, float(env.metadata.get("render_fps") or 30))
        try:
            with rendering_errors(env_id):  # MuJoCo without a display: MUJOCO_GL, in one line
                returns, lengths = gym_episodes(task, model, episodes, seed, writer, env=env)
            writer.close()
        except BaseException:
            writer.abort()
            raise
    finally:
        env.close()
    where = f"{env_id} (gymnasium{' twin' if not task.name.startswith('gym:') else ''})"
    return returns, lengths, where, writer


def play_run(directory: str | Path, episodes: int = 5, video: str | Path | None = None, device: str = "auto",
             seed: int = 0) -> dict:
    """Run the trained plain policy of an RL run directory for ``episodes`` episodes and summarise them.

    Without ``video`` the episodes run batched in the run's own environment from the start states that
    ``task.evaluate`` uses (so ``episodes`` = the run's eval_episodes and ``seed`` = the run's seed give the
    mean return ``nesgpu eval`` reports). With ``video`` (a path ending in .mp4 or .gif) they run one at a
    time in a gymnasium environment with ``render_mode="rgb_array"`` and every frame is written: a
    ``gym:<id>`` task's own environment, or for a built-in environment (cartpole, pendulum, acrobot,
    mountaincar) its gymnasium twin, started from the same states. Needs ``pip install 'nesgpu[play]'``.

    Returns a dict with ``returns`` and ``lengths`` (one per episode), ``mean_return``, ``std_return``,
    ``min_return``, ``max_return``, ``mean_length`` and, with a video, its path and ``frames``.
    Raises ValueError for a run that is not an RL run (use ``nesgpu eval``; a built-in task's is refused from
    its config.json, before its model is built or loaded), a bad episode count or path.
    """
    import torch

    from ..tasks.rl import RLTask
    from ..train.storage.runs import load_run

    episodes = _check_episodes(episodes)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int; got {seed!r}")
    path = _check_video(video)
    directory = Path(directory)
    name = _run_task_name(directory)
    if _is_other_task(name):  # refused before the dataset, the model or a language model's weights load
        raise _not_rl(directory, name)
    if isinstance(name, str) and name.startswith("custom:"):  # load_run's advice names eval's --task, not play's
        raise ValueError(f"{directory} trained a task of your own ({name}), which nesgpu play cannot rebuild; "
                         f"evaluate it with nesgpu eval {directory} --task module:task [--model module:make_model], "
                         f"or load it in Python: nesgpu.load_run({str(directory)!r}, task=..., model=...)")
    run = load_run(directory, device)
    task, model = run.task, run.model
    if not isinstance(task, RLTask):
        raise _not_rl(directory, run.config.task)
    model.eval()
    with torch.no_grad():
        if path is None:
            returns, lengths, where, writer = *_batched_episodes(task, model, episodes, seed), task.name, None
        else:
            returns, lengths, where, writer = _recorded_episodes(task, model, episodes, seed, path)
    mean = sum(returns) / episodes
    summary = {
        "run": str(directory), "task": task.name, "env": where, "episodes": episodes, "seed": seed,
        "mean_return": mean,
        "std_return": math.sqrt(sum((r - mean) ** 2 for r in returns) / episodes),
        "min_return": min(returns), "max_return": max(returns),
        "mean_length": sum(lengths) / episodes,
        "returns": returns, "lengths": [int(n) for n in lengths],
    }
    if writer is not None:
        summary.update(video=str(path), frames=writer.frames, fps=writer.fps)
    return summary


def add_play_parser(commands) -> None:
    p = commands.add_parser(
        "play", help="run a trained RL policy for a few episodes (optionally to a video)",
        description="Run the trained policy of an RL run directory for a few episodes; print each episode's "
                    "return and length, then a JSON summary. With --video the episodes are rendered through "
                    "gymnasium (render_mode='rgb_array'): a gym:<id> task in its own environment, a built-in "
                    "environment (cartpole, pendulum, acrobot, mountaincar) through its gymnasium twin, from the "
                    "same start states. Needs pip install 'nesgpu[play]'.")
    p.add_argument("run", metavar="DIR", help="a run directory of an RL task (config.json + model.safetensors)")
    p.add_argument("--episodes", type=int, default=5, help="episodes to run (default 5)")
    p.add_argument("--video", metavar="OUT.mp4|OUT.gif", help="write the episodes' frames to an mp4 or a gif")
    p.add_argument("--seed", type=int, default=0, help="start states (default 0; the run's seed and its "
                   "--eval-episodes give nesgpu eval's episodes)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    add_trust_flag(p, "")
    p.set_defaults(func=run_play)


def run_play(args: argparse.Namespace) -> int:
    consent_to_run_code(Path(args.run), args.trust_run_code, "play")  # before anything the run names is imported
    summary = play_run(args.run, episodes=args.episodes, video=args.video, device=args.device, seed=args.seed)
    for i, (ret, length) in enumerate(zip(summary["returns"], summary["lengths"]), 1):
        print(f"episode {i}: return {ret:.2f}, length {length}")
    print(json.dumps(summary))
    return 0


__all__ = ["VERIFIED_TWINS", "add_play_parser", "gym_episodes", "play_run"]
