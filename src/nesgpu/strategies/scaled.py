"""What the strategies with a sigma per parameter share (SNES, CEM): the members' fitness, ranked utilities,
and the rule that turns a sum over members into the population's update.

A strategy of this family searches theta + sigma * s_r * (S o z_d): ``sigma`` is the scalar it starts from and
``S`` the per-parameter scale it adapts (the perturbed model's scales, one tensor per parameter, 1 at the
start). It knows nothing of the model: :meth:`ScaleAdapting.scale_weights` gives the weights of the statistic
``sum_d w_d (z_d o z_d - 1)`` the population sums, and :meth:`ScaleAdapting.rescale` the new ``S`` from it,
elementwise.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from .base import Strategy, StrategyState
from .schedules import Schedule


def member_fitness(fitness: torch.Tensor, antithetic: bool) -> torch.Tensor:
    """The members' fitness (S, D): each sign's mean over its repeats (S = 2 with antithetic pairs, else 1)."""
    signs = 2 if antithetic else 1
    return fitness.view(signs, fitness.shape[0] // signs, fitness.shape[1]).mean(1)


def ranked_utilities(fitness: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[k]`` (best first) for the member of rank k among all entries of ``fitness``; tied members share
    the mean of their ranks' utilities, and all-tied fitness gives exactly zero (ties carry no signal)."""
    flat = fitness.flatten()
    ordered, order = flat.sort(descending=True)  # argsort's order (it is sort's indices)
    starts = torch.ones_like(ordered, dtype=torch.bool)  # runs of equal values, best first
    starts[1:] = ordered[1:] != ordered[:-1]
    run = starts.cumsum(0) - 1
    table = table.to(torch.float64)
    mean = torch.zeros(int(flat.numel()), dtype=table.dtype, device=table.device).index_add_(0, run, table)
    mean = mean / torch.bincount(run, minlength=flat.numel()).clamp(min=1).to(table.dtype)
    utilities = torch.empty_like(table)
    utilities[order] = mean[run]
    tied = ordered[0] == ordered[-1]  # all_tied(flat), from the sorted values
    return torch.where(tied, 0.0, utilities).view_as(fitness).to(fitness.dtype)


def pairwise_utilities(members: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Mirrored sampling with pairwise selection (Auger, Brockhoff and Hansen 2011): of each antithetic pair
    (members (2, D)) only the better can be selected, so that a pair never cancels itself out of the
    recombination (which shrinks CMA-ES's step size whenever selection is noisy). The D winners are ranked by
    ``table`` (D entries, best first; ties share); the losers weigh 0. A pair that ties gives its + member."""
    plus = members[0] >= members[1]
    utilities = ranked_utilities(torch.where(plus, members[0], members[1]), table)
    zero = torch.zeros_like(utilities)
    return torch.stack([torch.where(plus, utilities, zero), torch.where(plus, zero, utilities)])


def snes_utilities(n: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The NES utilities of ``n`` members, best first: max(0, ln(n/2 + 1) - ln k) normalised to sum 1, less
    1/n (Wierstra et al. 2014), so that they sum to zero."""
    k = torch.arange(1, n + 1, dtype=torch.float64, device=device)
    raw = (math.log(n / 2 + 1) - torch.log(k)).clamp(min=0)
    return (raw / raw.sum() - 1 / n).to(dtype)


def elite_utilities(n: int, elites: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """1 / elites for the ``elites`` best of ``n`` members, 0 for the others (the cross-entropy method)."""
    table = torch.zeros(n, dtype=dtype, device=device)
    table[:elites] = 1 / elites
    return table


def mean_step_weights(utilities: torch.Tensor, directions: int, sigma: float) -> torch.Tensor:
    """The weights (S, D) for ``PerturbedModel.update`` whose ``.grad``, stepped by SGD at lr 1, moves theta by
    ``sigma * S o sum_members u z`` (the natural-gradient step of the mean): update's estimate is
    ``-1/(S D sigma) sum_d (sum_s s u_s,d) S o z_d`` for these weights, so they are ``-S D sigma^2 u``."""
    signs = utilities.shape[0]
    return -utilities * (signs * directions * sigma * sigma)


class ScaleAdapting(Strategy):
    """What SNES, CEM and separable CMA-ES share: members' fitness ranked into weights by :meth:`table` (best
    first), the mean moved by ``sigma * S o sum_members w z`` (SGD at lr 1: :func:`mean_step_weights`), the same
    weights for the statistics the scales adapt by, and no sigma schedule (the strategy adapts sigma)."""

    default_lr = 1.0  # the mean's step is sigma * S o (...) already, whatever sigma
    adapts_sigma = True
    adapts_scales = True
    pairwise: ClassVar[bool] = False  # antithetic pairs: only the better of each pair competes (pairwise_utilities)

    def __init__(self, directions: int, antithetic: bool = True, sigma_schedule: Schedule | None = None):
        super().__init__(directions, antithetic, sigma_schedule)
        if sigma_schedule is not None:
            raise ValueError(f"{self.name} adapts a sigma per parameter itself: no sigma schedule applies (drop "
                             f"--sigma-schedule)")
        self.members = directions * (2 if antithetic else 1)
        # who competes for the weights: every member, or with pairwise selection one per antithetic pair
        self.candidates = directions if self.pairwise and antithetic else self.members
        self._told: tuple | None = None  # (fitness, its weights) of the latest step
        self._tables: dict = {}  # table(device) by device: built once

    def evolving(self, num_perturbed, limit: int | None = None, why: str = "", instead: str = "") -> int:
        """``num_perturbed`` (n, the model's evolving parameters) checked: a positive int, at most ``limit`` (a
        ValueError says ``why`` the limit and what to use ``instead``); a bool is a TypeError."""
        if isinstance(num_perturbed, bool):
            raise TypeError(f"{self.name}'s num_perturbed is a count of parameters (pm.num_perturbed), an int; got "
                            f"{num_perturbed!r}")
        if not (isinstance(num_perturbed, int) and num_perturbed > 0):
            raise ValueError(f"{self.name}'s rates need num_perturbed (pm.num_perturbed); got {num_perturbed!r}")
        if limit is not None and num_perturbed > limit:
            raise ValueError(f"{self.name} {why}, for models of up to {limit:,} evolving parameters; this one has "
                             f"{num_perturbed:,}: use {instead}")
        return num_perturbed

    def competes(self, why: str = "recombines the better half of its members") -> None:
        """A ValueError unless at least two candidates compete: CMA-ES recombines the mu = candidates // 2 best
        (one candidate leaves none, and NaN weights and rates); NES's utilities of one candidate are zero."""
        if self.candidates < 2:
            pairs = " (one per antithetic pair)" if self.candidates != self.members else ""
            raise ValueError(f"{self.name} {why}{pairs}, so it needs at least 2 of them; got {self.candidates} "
                             f"({self.directions} direction(s), antithetic={self.antithetic}): raise the population")

    def table(self, device) -> torch.Tensor:
        """The weight of the candidate of each rank, best first (:attr:`candidates` of them)."""
        raise NotImplementedError

    def make_optimizer(self, parameters, lr: float | None = None) -> torch.optim.Optimizer:
        return torch.optim.SGD(parameters, lr=self.default_lr if lr is None else lr)

    @classmethod
    def lr_for_sigma(cls, sigma: float) -> float:
        """1, whatever sigma: the mean's step is in units of sigma already."""
        return cls.default_lr

    def scale_weights(self, state: StrategyState, fitness: torch.Tensor) -> torch.Tensor:
        """The members' weights (S, D) by rank (ties share): the mean's, and the statistics'."""
        if self._told is not None and self._told[0] is fitness:  # the step's update asks again: computed once
            return self._told[1]
        members = member_fitness(self.check(fitness, state), self.antithetic)
        table = self._tables.get(members.device)
        if table is None:
            table = self._tables[members.device] = self.table(members.device)
        rank = pairwise_utilities if self.candidates != self.members else ranked_utilities
        weights = rank(members, table)
        self._told = (fitness, weights)
        return weights

    def tell(self, state: StrategyState, fitness: torch.Tensor, sq_norms: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, StrategyState]:
        weights = self.scale_weights(state, fitness)
        return mean_step_weights(weights, self.directions, state.sigma), self.advance(state, state.sigma)


__all__ = ["ScaleAdapting", "elite_utilities", "mean_step_weights", "member_fitness", "pairwise_utilities",
           "ranked_utilities", "snes_utilities"]
