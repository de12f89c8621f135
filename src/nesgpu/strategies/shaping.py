"""Fitness shaping: map raw fitness (higher is better) to the utilities that weight the noise.

Every shaping keeps one rule: **ties carry no signal.** Members whose fitness is equal get equal utilities,
and a fitness whose entries are all equal shapes to exactly zero, so a step (or a prompt) where every member
ties adds exactly nothing to ``.grad``. Without the rule, the ranks of tied members carry their position in
the population: an antithetic step of all-equal fitness gave every direction the same nonzero weight, a full
optimizer step in a random direction.
"""

from __future__ import annotations

import torch


def tied_ranks(values: torch.Tensor) -> torch.Tensor:
    """The 0-based ranks of a 1-d tensor, ties sharing the mean of the ranks they span (SciPy's "average"
    method): ``tied_ranks([3, 1, 3, 2]) == [2.5, 0, 2.5, 1]``. In the input's dtype, on its device."""
    order = values.argsort()
    ordered = values[order]
    # runs of equal values in sorted order: a new run starts wherever the value changes
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    run = starts.cumsum(0) - 1  # the run of each sorted position
    counts = torch.bincount(run).to(values.dtype)
    mean_rank = counts.cumsum(0) - (counts + 1) / 2  # of the positions first .. last of each run
    ranks = torch.empty_like(ordered)
    ranks[order] = mean_rank[run]
    return ranks


def centered_ranks(fitness: torch.Tensor) -> torch.Tensor:
    """Ranks of all entries, scaled to [-0.5, 0.5] (Salimans et al. 2017); tied entries share the mean of their
    ranks, so all-equal fitness gives exactly zero. Invariant to monotone transforms."""
    fitness = _working(fitness)
    n = fitness.numel()
    ranks = tied_ranks(fitness.flatten())
    # centred before scaling: a rank at the middle, (n - 1) / 2, is exactly zero
    return ((ranks - (n - 1) / 2) / max(n - 1, 1)).view_as(fitness)


def _working(fitness: torch.Tensor) -> torch.Tensor:
    """Fitness in a dtype that holds its ranks exactly: float32 for integers and half precision."""
    if fitness.dtype in (torch.float32, torch.float64):
        return fitness
    return fitness.float()


def all_tied(fitness: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor (no host read): whether every entry equals every other."""
    return fitness.amax() == fitness.amin()


def z_score(fitness: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(f - mean) / std over all entries; all-equal fitness gives exactly zero (the mean of equal values can
    differ from them in the last bit, which the division would blow up)."""
    fitness = _working(fitness)
    shaped = (fitness - fitness.mean()) / (fitness.std(unbiased=False) + eps)
    return torch.where(all_tied(fitness), torch.zeros_like(shaped), shaped)


def raw(fitness: torch.Tensor) -> torch.Tensor:
    """Fitness less its mean (the baseline of the plain estimator, Williams 1992): unscaled, so the update
    follows the fitness's own units; all-equal fitness gives exactly zero."""
    fitness = _working(fitness)
    shaped = fitness - fitness.mean()
    return torch.where(all_tied(fitness), torch.zeros_like(shaped), shaped)


def centered_per_repeat(utilities: torch.Tensor) -> torch.Tensor:
    """Utilities (R, D) less each repeat's mean over the directions, a repeat whose utilities all tie exactly
    zero: without antithetic pairs, a constant added to every direction of a repeat (a prompt every member
    answered alike, whose shared rank is not the middle one) would step along the sum of the noise, a random
    direction. With antithetic pairs the two signs cancel such a constant already."""
    centered = utilities - utilities.mean(-1, keepdim=True)
    tied = utilities.amax(-1, keepdim=True) == utilities.amin(-1, keepdim=True)
    return torch.where(tied, torch.zeros_like(centered), centered)


SHAPINGS = {"centered_ranks": centered_ranks, "z_score": z_score, "raw": raw}


def get_shaping(name: str):
    if name not in SHAPINGS:
        raise ValueError(f"unknown fitness shaping {name!r}; expected one of {sorted(SHAPINGS)}")
    return SHAPINGS[name]


def top_directions(plus: torch.Tensor, minus: torch.Tensor, b: int) -> torch.Tensor:
    """Boolean mask (D,) of the b directions whose better side, max(f+, f-), is highest (ARS V1-t/V2-t)."""
    d = plus.numel()
    if not 1 <= b <= d:
        raise ValueError(f"top_b must be in [1, {d}]; got {b}")
    mask = torch.zeros(d, dtype=torch.bool, device=plus.device)
    mask[torch.maximum(plus, minus).topk(b).indices] = True
    return mask
