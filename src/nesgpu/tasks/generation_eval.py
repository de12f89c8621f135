"""The evaluation side of :class:`~nesgpu.tasks.generation.GenerationTask`: the plain model's greedy completions of
the held-out prompts and, beside the metric, what a GRPO user reads at an evaluation (``eval_`` columns: the reward
and each function's, the completions' length and share cut short, ``eval_kl``), ``pass@k`` from sampled
completions (``eval_generations``), and the drift on an off-task text (``drift_nll``); and the step's ``kl`` from
the starting model (:mod:`nesgpu.tasks.divergence`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..model import PerturbedModel
from ..noise import derive_seed
from .divergence import drift_nll, kl_sums, pass_at_k
from .likelihood import joined, kept_tokens
from .reward_stats import clipped_ratio, function_columns, function_sums
from .scores import logged_columns

SAMPLED = 0x706173  # the key of an evaluation's sampled completions (seed, step, SAMPLED)
KL_KEYS = ("kl/sum", "kl/count")


class Evaluating:
    """What :class:`~nesgpu.tasks.generation.GenerationTask` measures beside its fitness: its evaluation, and
    the distance from the run's starting model (:class:`~nesgpu.tasks.protocol.ComparesToStart`)."""

    start_weights = None  # the starting weights (the trainer's, via compare_to), or None
    _drift_start: float | None = None  # drift_nll of the starting model, once measured
    _held_metrics: dict | None = None  # what the reward functions logged on an evaluation's greedy completions

    @property
    def wants_start(self) -> bool:
        """Whether the task measures from the starting model (``kl``, a drift text, or the KL penalty ``beta``)."""
        return self.kl or self.drift_texts is not None or self.beta > 0

    def compare_to(self, start) -> None:
        """Measure ``kl`` and the change of ``drift_nll`` from ``start`` (an object whose ``loaded()`` holds the
        model at its starting weights; None: no ``kl`` and no change of ``drift_nll`` are logged)."""
        self.start_weights, self._drift_start = start, None

    def evaluation_info(self) -> dict[str, float]:
        """The latest evaluation's columns beside the metric (see :meth:`evaluate`)."""
        return dict(self._evaluation)

    def temperature_or_one(self) -> float:
        """The temperature both models' distributions are taken at: the task's, or 1 for greedy decoding."""
        return self.temperature if self.temperature > 0 else 1.0

    @property
    def _measures_kl(self) -> bool:
        return self.start_weights is not None and self.kl

    def step_kl(self, pm: PerturbedModel, ids: torch.Tensor, mask: torch.Tensor, new: torch.Tensor) -> dict:
        """The step's KL sums on the completions of its first direction (both signs; ``ids``, ``mask``: the
        prompts, ``new``: every row's new tokens); see :meth:`_first_direction_kl`."""
        signs = 2 if pm.antithetic else 1

        def measure():
            first = new[torch.arange(0, new.shape[0], pm.local_directions, device=new.device)]
            return self._kl_on(pm.model, ids.repeat(signs, 1), mask.repeat(signs, 1), first)
        return self._first_direction_kl(pm, ids.device, measure)

    def drawn_kl(self, pm: PerturbedModel, drawn) -> dict:
        """The step's KL sums on the likelihood fitness's completions (drawn from the plain model)."""
        return self._first_direction_kl(pm, drawn.ids.device, lambda: kl_sums(
            pm.model, self.start_weights, drawn.ids, drawn.mask, drawn.kept, self.temperature_or_one()))

    def _first_direction_kl(self, pm: PerturbedModel, device, measure) -> dict:
        """``measure()``'s KL sums where this block evaluates the first direction; zero sums in every other
        block and process, so that each gives the same keys and the value is one process's without chunks
        (greedy completions are the same in any block; sampled ones are drawn for the block's rows together,
        so they differ with the chunk size); nothing without a start to measure from."""
        if not self._measures_kl:
            return {}
        if pm.noise_range.start != 0:
            return dict.fromkeys(KL_KEYS, torch.zeros((), dtype=torch.float64, device=device))
        return dict(zip(KL_KEYS, measure()))

    def _kl_on(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, new: torch.Tensor):
        """KL sums of ``model`` from the start on each prompt's completion ``new``, up to where it ends."""
        kept = kept_tokens(self.tokenizer, new.cpu(), self.stop).to(ids.device)
        joint = joined(ids, mask, new, kept, self.tokenizer.pad_token_id)
        return kl_sums(model, self.start_weights, *joint, kept, self.temperature_or_one())

    # ----- the plain model ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> float:
        """Accuracy (or mean reward) of the plain model, greedy, on the held-out prompts; the completions are
        kept in :attr:`samples`, and :meth:`evaluation_info` gives ``eval_reward``/``_std``,
        ``eval_rewards/<name>/mean``/``std``, ``eval_completions/mean_length``, ``/min_length``, ``/max_length``
        and ``/clipped_ratio``,
        ``eval_kl`` (from the starting model), with ``eval_generations`` K ``eval_pass@K`` and ``eval_pass@1``,
        and with drift texts ``drift_nll`` and ``drift_nll_change``."""
        rewards, self.samples, sums, lengths = [], [], {}, []
        kl = [torch.zeros((), dtype=torch.float64)] * 2
        for start in range(0, len(self.eval_prompts), self.eval_batch):
            prompts = self.eval_prompts[start:start + self.eval_batch]
            ids, mask = self.encode_prompts(prompts, model)
            new = self.plain_tokens(model, ids, mask, seed=None)
            completions = self.decode_tokens(new)
            scores = self.score_completions(prompts, completions, new, evaluating=True)
            rewards.append(scores)
            _add(sums, function_sums(self.reward, scores, self.reward_names))
            lengths += [len(t) for t in self.tokenizer(completions, add_special_tokens=False).input_ids]
            if self._measures_kl:
                kl = [a + b.cpu() for a, b in zip(kl, self._kl_on(model, ids, mask, new))]
            extra = logged_columns(self.reward, len(completions))
            self.samples += [{**{k: v[i] for k, v in extra.items()}, "prompt": p, "completion": c, "reward": float(r)}
                             for i, (p, c, r) in enumerate(zip(prompts, completions, scores.tolist()))]
        rewards = torch.cat(rewards).double()
        info = {"eval_reward": float(rewards.mean()),
                "eval_reward_std": float(rewards.std()) if rewards.numel() > 1 else float("nan"),
                "eval_completions/mean_length": sum(lengths) / len(lengths),
                "eval_completions/min_length": min(lengths), "eval_completions/max_length": max(lengths),
                "eval_completions/clipped_ratio": clipped_ratio(lengths, range(len(lengths)), self.max_new_tokens)}
        info.update({f"eval_{k}": float(v) for k, v in function_columns(sums, self.reward_names).items()})
        if self._measures_kl:
            info["eval_kl"] = float(kl[0] / kl[1])
        if self.eval_generations:  # a reward function's log_metric values are the greedy completions', as without
            held = self.logged_metrics()
            info.update(self._sampled(model))
            self.logged_metrics()
            self._held_metrics = held
        info.update(self._drift(model))
        self._evaluation = info
        if self.correct_at is None:
            return float(rewards.mean())
        return float((rewards >= self.correct_at).float().mean())

    def _sampled(self, model: nn.Module) -> dict[str, float]:
        """pass@K and pass@1 of ``eval_generations`` (K) sampled completions per held-out prompt, at the task's
        temperature (1 where it decodes greedily), seeded by (seed, step); and the share of prompts whose K
        rewards are all alike (``eval_frac_reward_zero_std``)."""
        k = self.eval_generations
        if not k:
            return {}
        rows = [p for p in self.eval_prompts for _ in range(k)]
        scores = []
        for start in range(0, len(rows), self.eval_batch):
            prompts = rows[start:start + self.eval_batch]
            ids, mask = self.encode_prompts(prompts, model)
            seed = derive_seed(self.seed, self.latest_step, SAMPLED, start)
            new = self.plain_tokens(model, ids, mask, seed=seed, temperature=self.temperature_or_one())
            scores.append(self.score_completions(prompts, self.decode_tokens(new), new, evaluating=True))
        by_prompt = torch.cat(scores).view(len(self.eval_prompts), k)
        correct = (by_prompt >= self.correct_at).tolist()
        alike = (by_prompt.amax(1) == by_prompt.amin(1)).double().mean()
        return {f"eval_pass@{k}": pass_at_k(correct, k), "eval_pass@1": pass_at_k(correct, 1),
                **({"eval_frac_reward_zero_std": float(alike)} if k > 1 else {})}

    def _drift(self, model: nn.Module) -> dict[str, float]:
        """``drift_nll`` on the drift texts, and with the starting weights its change from the starting model
        (measured once, at them)."""
        if self.drift_texts is None:
            return {}
        value = drift_nll(model, self.tokenizer, self.drift_texts, self.eval_batch)
        if self.start_weights is None:
            return {"drift_nll": value}
        if self._drift_start is None:
            with self.start_weights.loaded():
                self._drift_start = drift_nll(model, self.tokenizer, self.drift_texts, self.eval_batch)
        return {"drift_nll": value, "drift_nll_change": value - self._drift_start}


def _add(total: dict, part: dict) -> None:
    for key, value in part.items():
        total[key] = value.cpu() + total[key] if key in total else value.cpu()


__all__ = ["Evaluating", "KL_KEYS"]
