"""What a reward function gave, checked before it becomes fitness: one finite float per completion, of a size
the step's float32 statistics can hold; and the columns its functions logged for ``samples.jsonl``."""

from __future__ import annotations

import json
import math

import torch


def checked_rewards(rewards, completions: list[str]) -> torch.Tensor:
    """``rewards`` as a float32 CPU tensor of one reward per completion; a TypeError or ValueError names what
    the reward function returned instead."""
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"the reward function must return a torch.Tensor of {len(completions)} floats; got "
                        f"{type(rewards).__name__}")
    if rewards.is_complex():
        raise TypeError(f"the reward function must return real rewards; got a {rewards.dtype} tensor")
    if rewards.shape != (len(completions),):
        raise ValueError(f"the reward function must return shape ({len(completions)},), one reward per "
                         f"completion; got {tuple(rewards.shape)}")
    return _in_range(rewards.detach().cpu().double(), completions).float()


MAX_REWARD = 1e15
"""The largest reward magnitude taken: the step's statistics (means, standard deviations) are float32, in
which the squares of larger values overflow."""


def _in_range(rewards: torch.Tensor, completions: list[str]) -> torch.Tensor:
    """``rewards`` (float64) if every one is finite and at most :data:`MAX_REWARD` in magnitude; else a
    ValueError naming the first other value and its completion."""
    bad = ~(rewards.abs() <= MAX_REWARD)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        what = "a non-finite reward" if not math.isfinite(rewards[i]) else f"a reward beyond +-{MAX_REWARD:.0e}"
        raise ValueError(f"the reward function returned {what}, {float(rewards[i])!r}, for completion "
                         f"{completions[i]!r:.80}; rewards must be finite numbers of at most {MAX_REWARD:.0e} in "
                         f"magnitude (rescale them)")
    return rewards


def logged_columns(reward, rows: int) -> dict[str, list]:
    """The columns a reward's functions gave ``log_extra`` in its latest call (TRL's completions table), one value
    per completion, as JSON values (anything else as its text, a non-finite float as None), the trainer's own keys
    left out."""
    logged = getattr(reward, "logged", None)
    columns = logged.get("extra") if isinstance(logged, dict) else None
    if not isinstance(columns, dict):
        return {}

    def as_json(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        try:
            json.dumps(v, allow_nan=False)
            return v
        except (TypeError, ValueError):
            return str(v)

    return {str(k): [as_json(v) for v in values] for k, values in columns.items()
            if len(values) == rows and str(k) not in ("step", "prompt", "completion", "reward")}


__all__ = ["MAX_REWARD", "checked_rewards", "logged_columns"]
