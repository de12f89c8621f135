"""TRL's KL penalty (``beta``) the ES way: in the fitness, not in a loss.

With ``beta > 0`` each member's fitness on a prompt is its reward less ``beta`` times its KL from the run's
starting model on its own completions of that prompt, by TRL's estimator (Schulman's k3: ``exp(r) - r - 1`` with
``r = log p_start - log p_member`` of each kept completion token, averaged over the member's kept tokens of the
prompt; 0 where it kept none). Both models' distributions are taken at the task's temperature (1 where it decodes
greedily). The cost: one teacher-forced population forward over every member's own completions, and one forward
of the plain model at its starting weights (each distinct completion once).

The rewards stay the task's raw fitness (what ``reward`` and the probe of ``--sigma auto`` read). Each block puts
its members' penalties, in their directions' columns, in the step's statistics (:data:`PENALTY`, summed over the
blocks and processes, exact: the other columns are zeros); :meth:`PenalisesKL.keep_penalty` takes the whole
population's from them at the end of the step and logs ``kl_penalty`` (beta x the members' mean KL), and
:meth:`PenalisesKL.penalised` subtracts beta x them from the shaped rewards: as GRPO subtracts beta x KL from the
standardised advantage, beta weighs the KL the same with ``shaping="per_prompt"`` or ``"none"`` (where the fitness
is ``reward - beta x KL``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..model import PerturbedModel
from .divergence import rows_per_forward
from .likelihood import joined, token_logp

PENALTY = "kl_penalty/members"  # (signs * prompts, D) the members' KL, summed over the blocks and processes


def check_beta(beta, fitness: str) -> float:
    """``beta`` as a float >= 0 (0: no penalty); a ValueError for another value, or beta > 0 with the likelihood
    fitness (its members are scored on completions drawn once from the plain model, not on their own)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0 (the KL penalty's weight; 0: none); got {beta!r}")
    if beta and fitness == "likelihood":
        raise ValueError(f"beta {beta} (the KL penalty on each member's own completions) needs fitness 'reward'; "
                         f"fitness 'likelihood' scores the members on completions of the plain model")
    return float(beta)


def member_kl(pm: PerturbedModel, start, ids: torch.Tensor, mask: torch.Tensor, new: torch.Tensor,
              kept: torch.Tensor, pad_id: int, temperature: float, generations: int) -> torch.Tensor:
    """(signs * P, D) float64: each member's mean k3 over its kept tokens of each prompt's ``generations``
    completions (0 where it kept none). ``ids``, ``mask``: the (P * generations) prompts; ``new``, ``kept``: the
    new tokens of every population row and those that count; ``start.loaded()`` holds the starting weights."""
    signs, d = (2 if pm.antithetic else 1), pm.local_directions
    rows, rows_mask = joined(pm.member_rows(ids), pm.member_rows(mask), new, kept, pad_id)
    kept = kept.to(rows.device)
    member = _population_logp(pm, rows, rows_mask, kept, temperature)
    reference = _reference_logp(pm.model, start, rows, rows_mask, kept, temperature).to(member.device)
    ratio = (reference - member).double()
    counted = kept.to(ratio.device, torch.float64)
    terms = (ratio.exp() - ratio - 1) * counted

    def per_prompt(t: torch.Tensor) -> torch.Tensor:  # (rows, T) -> (signs, P, D): summed over tokens and samples
        return pm.by_member(t.sum(1)).view(signs, -1, generations, d).sum(2)
    return (per_prompt(terms) / per_prompt(counted).clamp_min(1)).reshape(-1, d).to(ids.device)


def _population_logp(pm: PerturbedModel, ids: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """(rows, T) each member's log-probabilities of its own row's tokens, teacher-forced: the population rows in
    forwards of whole samples (every member's row of each), as many as keep the logits below
    :func:`~nesgpu.tasks.divergence.rows_per_forward`'s bound (at least one)."""
    signs, d = (2 if pm.antithetic else 1), pm.local_directions
    samples = ids.shape[0] // (signs * d)
    size = max(1, rows_per_forward(pm.model, kept.shape[1] + 1) // (signs * d))

    def part(t: torch.Tensor, s: slice) -> torch.Tensor:  # the rows of samples s, laid out as member_rows does
        return pm.by_member(t)[:, s].reshape(-1, *t.shape[1:])
    parts = []
    with pm.perturbing():
        for first in range(0, samples, size):
            s = slice(first, first + size)
            parts.append(pm.by_member(token_logp(pm.model, part(ids, s), part(mask, s), part(kept, s), temperature)))
    return torch.cat(parts, 1).reshape(ids.shape[0], -1)


@torch.no_grad()
def _reference_logp(model: nn.Module, start, ids: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """(rows, T) the starting model's log-probabilities of each row's tokens: each distinct row once (members
    often answer alike), in batches below :func:`~nesgpu.tasks.divergence.rows_per_forward`'s bound."""
    width = ids.shape[1]
    distinct, inverse = torch.unique(torch.cat([ids, mask.to(ids.dtype)], 1), dim=0, return_inverse=True)
    ids, mask = distinct[:, :width], distinct[:, width:].to(mask.dtype)
    kept = mask[:, -kept.shape[1]:].bool()  # the completion's mask is its kept tokens
    size = rows_per_forward(model, kept.shape[1] + 1)
    with start.loaded():
        logp = torch.cat([token_logp(model, ids[i:i + size], mask[i:i + size], kept[i:i + size], temperature)
                          for i in range(0, ids.shape[0], size)])
    return logp[inverse.to(logp.device)]


class PenalisesKL:
    """The KL penalty of a :class:`~nesgpu.tasks.generation.GenerationTask` (``beta``), from the starting weights
    the trainer hands over (:class:`~nesgpu.tasks.protocol.ComparesToStart`)."""

    beta = 0.0
    _penalty: torch.Tensor | None = None  # the step's members' KL (signs * prompts, D), until the fitness is shaped

    def penalty_info(self, pm: PerturbedModel, ids: torch.Tensor, mask: torch.Tensor, new: torch.Tensor,
                     kept: torch.Tensor | None, row_of: list[int]) -> dict:
        """The block's members' KL in their directions' columns of a (signs * prompts, D) statistic (nothing
        where beta is 0). ``kept``: the kept tokens of the distinct rows of ``new`` (on the host), ``row_of``: each
        row's."""
        self._penalty = None  # a step's penalty is that of its own evaluation only
        if not self.beta:
            return {}
        if self.start_weights is None:
            raise ValueError(f"beta {self.beta} measures each member's KL from the run's starting weights; this "
                             f"task was given none (the trainer gives them: compare_to)")
        kept = kept[torch.tensor(row_of)]
        kl = member_kl(pm, self.start_weights, ids, mask, new, kept, self.tokenizer.pad_token_id,
                       self.temperature_or_one(), self.generations)
        full = kl.new_zeros(kl.shape[0], pm.directions)
        full[:, pm.noise_range.start:pm.noise_range.stop] = kl
        return {PENALTY: full}

    @property
    def penalty_pending(self) -> bool:
        """Whether the step's members' KL awaits :meth:`penalised` (kept by :meth:`keep_penalty`)."""
        return self._penalty is not None

    def keep_penalty(self, info: dict) -> None:
        """Take the step's members' KL out of ``info`` (the whole population's), for :meth:`penalised`, and log
        ``kl_penalty``, beta x their mean."""
        if PENALTY in info:
            self._penalty = info.pop(PENALTY)
            info["kl_penalty"] = self.beta * self._penalty.mean()

    def penalised(self, fitness: torch.Tensor) -> torch.Tensor:
        """The rewards ``fitness`` shaped, less beta x the members' KL of the step (float64; taken once): GRPO's
        advantage less beta x KL, so that beta weighs the KL as TRL's does, shaped or not (standardising the
        penalty with the rewards would give a prompt whose rewards all tie a full-weight KL fitness)."""
        penalty, self._penalty = self._penalty, None
        shaped = self.shape(fitness)
        dtype = torch.promote_types(shaped.dtype, penalty.dtype)
        return shaped.to(dtype) - self.beta * penalty.to(shaped.device, dtype)


__all__ = ["PENALTY", "PenalisesKL", "check_beta", "member_kl"]
