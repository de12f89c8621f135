"""Fitness shaping: map raw fitness (higher is better) to the utilities that weight the noise."""

from __future__ import annotations

import torch


def centered_ranks(fitness: torch.Tensor) -> torch.Tensor:
    """Ranks of all entries, scaled to [-0.5, 0.5] (Salimans et al. 2017). Invariant to monotone transforms."""
    n = fitness.numel()
    ranks = torch.empty(n, dtype=fitness.dtype, device=fitness.device)
    ranks[fitness.flatten().argsort()] = torch.arange(n, dtype=fitness.dtype, device=fitness.device)
    return (ranks / max(n - 1, 1) - 0.5).view_as(fitness)


def z_score(fitness: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(f - mean) / std over all entries."""
    return (fitness - fitness.mean()) / (fitness.std(unbiased=False) + eps)


def raw(fitness: torch.Tensor) -> torch.Tensor:
    """Fitness as is."""
    return fitness


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
