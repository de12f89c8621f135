"""The likelihood fitness of a generation task: a smooth, dense fitness from forward passes alone.

A member's reward on its greedy completions is piecewise constant in its weights: a small sigma often changes
no answer, and the step carries no signal. With ``fitness="likelihood"`` each step instead samples ``K``
completions per prompt from the current model (at the task's temperature), scores them once, and gives member
``i`` the reward its own policy expects from those completions, by self-normalised importance weights::

    F_i(prompt) = sum_k softmax_k(log p_i(y_k | prompt) - log p_0(y_k | prompt)) * r_k

One teacher-forced population forward computes every member's ``log p_i``. ``F`` is smooth in the weights, and
its gradient at sigma -> 0 is ``1/K sum_k (r_k - mean r) grad log p(y_k)``: the policy gradient with a mean
baseline, which GRPO follows by backprop, estimated here from forward passes.

These are the pieces; :class:`~nesgpu.tasks.generation.GenerationTask` puts them together.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Drawn:
    """The completions a step's members are scored on, drawn once from the plain model.

    Attributes:
        step: the step they were drawn for.
        ids, mask: (P * K, L) each prompt (left-padded) followed by one completion (right-padded).
        kept: (P * K, T) the completion tokens that count, through the first stop (or end of sequence).
        rewards: (P, K) their rewards.
        base: (P * K,) their log-likelihood under the plain model.
    """

    step: int
    ids: torch.Tensor
    mask: torch.Tensor
    kept: torch.Tensor
    rewards: torch.Tensor
    base: torch.Tensor

    @property
    def k(self) -> int:
        """Completions per prompt."""
        return self.rewards.shape[1]

    def varied(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts whose completions did not all score alike, and their rows, as indices on the device.

        Only these carry a signal. A prompt whose completions all scored ``r`` gives every member exactly ``r``:
        its importance weights would sum to one only up to rounding, and the per-prompt standardisation would
        blow that rounding up into a full-weight random fitness."""
        rewards = self.rewards.cpu()  # scored on the host: no device sync
        prompts = (rewards.amax(1) > rewards.amin(1)).nonzero().flatten()
        rows = (prompts.unsqueeze(1) * self.k + torch.arange(self.k)).flatten()
        return prompts.to(self.ids.device), rows.to(self.ids.device)

    def constant_fitness(self, signs: int, directions: int) -> torch.Tensor:
        """(signs * P, directions): every member's fitness where each prompt's completions scored alike (each
        prompt's first reward); the varied prompts' rows are overwritten by their expected rewards."""
        first = self.rewards[:, 0].to(self.ids.device, self.base.dtype)  # the dtype of the members' expectations
        return first.repeat(signs).unsqueeze(1).expand(-1, directions).clone()


def kept_tokens(tokenizer, new: torch.Tensor, stops: tuple[str, ...]) -> torch.Tensor:
    """(rows, T) bool: each row's tokens up to and including the one that completes its first stop string or
    is the end-of-sequence token; what follows did not shape the scored text."""
    rows, length = new.shape
    cut = torch.full((rows,), length, dtype=torch.long)
    eos = getattr(tokenizer, "eos_token_id", None)
    for n in range(1, length + 1):
        open_rows = cut == length
        if not open_rows.any():  # every row has ended: no more prefixes to decode
            break
        texts = tokenizer.batch_decode(new[:, :n], skip_special_tokens=True)
        ends = torch.tensor([any(s in t for s in stops) for t in texts])
        if eos is not None:
            ends |= new[:, n - 1] == eos
        cut[ends & open_rows] = n
    return torch.arange(length).unsqueeze(0) < cut.unsqueeze(1)


class CompletionIds(Sequence):
    """Each completion's token ids as scored, up to and including the token that ends it (:func:`kept_tokens`),
    a list per row (rows ``row_of`` of ``tokens`` when given), worked out at the first read: finding where a
    stop string ends decodes the rows once per token, which a reward function that never reads them skips."""

    def __init__(self, tokenizer, tokens: torch.Tensor, stops: tuple[str, ...], row_of: list[int] | None = None,
                 kept: torch.Tensor | None = None):
        self._args = (tokenizer, tokens, stops, row_of, kept)  # kept: the tokens' kept_tokens, where known already
        self._rows = tokens.shape[0] if row_of is None else len(row_of)
        self._ids: list[list[int]] | None = None

    def _value(self) -> list[list[int]]:
        if self._ids is None:
            tokenizer, tokens, stops, row_of, kept = self._args
            tokens = tokens.cpu()
            kept = kept_tokens(tokenizer, tokens, stops) if kept is None else kept.cpu()
            ids = [row[k].tolist() for row, k in zip(tokens, kept)]
            self._ids = ids if row_of is None else [ids[i] for i in row_of]
        return self._ids

    def __getitem__(self, index):
        return self._value()[index]

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return repr(self._value())


def joined(ids: torch.Tensor, mask: torch.Tensor, new: torch.Tensor, kept: torch.Tensor, pad_id: int):
    """(ids, mask) of each prompt followed by its completion's kept tokens (pad after them)."""
    kept = kept.to(ids.device)
    tokens = torch.where(kept, new.to(ids.device), torch.full_like(new, pad_id, device=ids.device))
    return torch.cat([ids, tokens], 1), torch.cat([mask, kept.to(mask.dtype)], 1)


def sequence_logp(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor,
                  temperature: float) -> torch.Tensor:
    """(rows,) the log-likelihood of each row's last ``T = kept.shape[1]`` tokens where ``kept``, under the
    model's next-token distribution at ``temperature`` (:func:`token_logp`, summed)."""
    return token_logp(model, ids, mask, kept, temperature).sum(1)


def token_logp(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor,
               temperature: float) -> torch.Tensor:
    """(rows, T) the log-probability of each of a row's last ``T = kept.shape[1]`` tokens (0 where not
    ``kept``) under the model's next-token distribution at ``temperature``; positions count from each row's first
    real token, as ``generate()`` counts them for left-padded prompts."""
    length = kept.shape[1]
    options = {}
    accepts = inspect.signature(model.forward).parameters
    if "position_ids" in accepts:
        options["position_ids"] = (mask.long().cumsum(1) - 1).clamp_min(0)
    if "logits_to_keep" in accepts:  # the logits of the completion's positions only
        options["logits_to_keep"] = length + 1
    if "use_cache" in accepts:  # one forward: no KV cache to keep
        options["use_cache"] = False
    logits = model(input_ids=ids, attention_mask=mask, **options).logits[:, -length - 1:-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    chosen = logits.gather(-1, ids[:, -length:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
    return chosen * kept.to(chosen.device)


def importance_weighted(logp: torch.Tensor, base: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Each member's expected reward on the drawn completions: ``logp`` (signs, P * K, D) of the members,
    ``base`` (P * K,) of the plain model, ``rewards`` (P, K) -> (signs * P, D)."""
    signs, _, d = logp.shape
    prompts, k = rewards.shape
    ratio = (logp - base.view(1, -1, 1)).view(signs, prompts, k, d)
    weights = torch.softmax(ratio, 2)
    return (weights * rewards.view(1, prompts, k, 1).to(weights)).sum(2).reshape(signs * prompts, d)


__all__ = ["CompletionIds", "Drawn", "importance_weighted", "joined", "kept_tokens", "sequence_logp", "token_logp"]
