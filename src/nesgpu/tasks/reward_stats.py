"""What a GRPO user reads every step, under TRL's names: each reward function's mean and std over the step's
completions (``rewards/<name>/mean``, ``rewards/<name>/std``: unweighted, a function's None values left out, the
std with Bessel's correction as TRL's ``nanstd``) and the share of completions cut at ``max_new_tokens``
(``completions/clipped_ratio``).

A step's completions are scored block by block, and under torchrun by several processes, so each block gives
sums (``rewards/<name>/sum``, ``/sum_sq``, ``/count``), which the population adds over blocks and processes
(the task's ``summed_info``), and :func:`function_columns` turns the step's totals into the mean and std.
"""

from __future__ import annotations

import torch

PARTS = ("sum", "sum_sq", "count")


def function_names(reward) -> list[str]:
    """The reward's functions' names, as TRL derives them (``__name__``): a
    :class:`~nesgpu.tasks.reward_data.Rewards`' each, else the one callable's."""
    names = getattr(reward, "names", None)
    return list(names) if names else [getattr(reward, "__name__", type(reward).__name__)]


def summed_keys(names: list[str]) -> frozenset[str]:
    """The sums each block gives for ``names`` (added over blocks and processes)."""
    return frozenset(f"rewards/{name}/{part}" for name in names for part in PARTS)


def function_sums(reward, total: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """The sums of each function's values over the completions just scored: a Rewards' own values (its
    ``values``, None where a function did not score), else the reward's ``total`` (one function)."""
    values = getattr(reward, "values", None)
    per_function = values if values is not None else [total.tolist()]
    sums = {}
    for name, column in zip(names, per_function):
        scored = torch.tensor([v for v in column if v is not None], dtype=torch.float64, device=total.device)
        sums[f"rewards/{name}/sum"] = scored.sum()
        sums[f"rewards/{name}/sum_sq"] = scored.square().sum()
        sums[f"rewards/{name}/count"] = torch.tensor(float(scored.numel()), dtype=torch.float64, device=total.device)
    return sums


def function_columns(info: dict, names: list[str]) -> dict[str, torch.Tensor]:
    """``rewards/<name>/mean`` and ``/std`` from the step's summed ``info`` (whose sums are taken out of it); a
    function that scored nothing this step gives NaN, as TRL's ``nanmean`` of nothing."""
    out = {}
    for name in names:
        total, squares, count = (info.pop(f"rewards/{name}/{part}") for part in PARTS)
        total, squares, count = (torch.as_tensor(v, dtype=torch.float64) for v in (total, squares, count))
        mean = total / count
        variance = (squares - count * mean.square()).clamp(min=0) / (count - 1)
        out[f"rewards/{name}/mean"] = mean
        out[f"rewards/{name}/std"] = torch.where(count > 1, variance.sqrt(), torch.full_like(mean, float("nan")))
    return out


def clipped_ratio(lengths: list[int], rows: list[int], max_new_tokens: int) -> float:
    """The share of the completions (rows ``rows`` of the distinct ones, whose token ``lengths`` are given)
    that reached ``max_new_tokens``: cut by the limit, not ended by a stop."""
    return sum(lengths[i] >= max_new_tokens for i in rows) / max(1, len(rows))


__all__ = ["clipped_ratio", "function_columns", "function_names", "function_sums", "summed_keys"]
