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


LENGTHS = "completions/length_counts"
"""A step's statistic: how many completions have each length in tokens (0 to max_new_tokens), added over
blocks and processes; :func:`length_columns` makes it TRL's ``completions/mean_length``, ``/min_length`` and
``/max_length``."""


def length_counts(lengths, max_new_tokens: int, device=None) -> torch.Tensor:
    """How many of ``lengths`` (tokens, at most ``max_new_tokens``: a list, or a tensor counted where it lies,
    without a host read) have each length: (max_new_tokens + 1,)."""
    lengths = torch.as_tensor(lengths, dtype=torch.long, device=device)
    return torch.bincount(lengths, minlength=max_new_tokens + 1).to(torch.float64)


def length_columns(counts) -> dict[str, torch.Tensor]:
    """TRL's ``completions/mean_length``, ``/min_length`` and ``/max_length`` from a step's summed
    :func:`length_counts` (NaN where it counted none)."""
    counts = torch.as_tensor(counts, dtype=torch.float64).cpu()
    seen = counts.nonzero().flatten()
    if not seen.numel():
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        return {"completions/mean_length": nan, "completions/min_length": nan, "completions/max_length": nan}
    lengths = torch.arange(counts.numel(), dtype=torch.float64)
    return {"completions/mean_length": (counts * lengths).sum() / counts.sum(),
            "completions/min_length": lengths[seen[0]], "completions/max_length": lengths[seen[-1]]}


__all__ = ["LENGTHS", "clipped_ratio", "function_columns", "function_names", "function_sums", "length_columns",
           "length_counts", "summed_keys"]
