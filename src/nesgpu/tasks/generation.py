"""A language model's population scored on a reward: every member generates for the step's prompts in one
batched ``generate()``, and a reward function scores the completions.

Rows are laid out (sign, prompt, direction) (:meth:`~nesgpu.PerturbedModel.member_rows`), so a block of
directions generates ``signs x prompts x block`` rows at once; chunking and torchrun split the directions.
The fitness has one repeat per (sign, prompt): shape (signs * prompts, D). Per-prompt shaping normalises each
prompt's rewards across every member (both signs, all directions, after the exchange between processes), as
"Evolution Strategies at Scale" and GRPO do, so prompts of different difficulty weigh alike.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..decode import CompiledDecode, check_compilable
from ..model import PerturbedModel
from ..noise import derive_seed
from .generation_checks import FITNESSES, REWARD_SHAPINGS, check_arguments, check_measures, check_prompts
from .engine_generation import EngineGenerating
from .generation_eval import KL_KEYS, Evaluating
from .kl_penalty import PENALTY, PenalisesKL, check_beta
from .likelihood import CompletionIds, Drawn, importance_weighted, joined, kept_tokens, sequence_logp
from .reward_calls import RewardCalls
from .reward_stats import (LENGTHS, clipped_ratio, function_columns, function_names, function_sums, length_columns,
                           length_counts, summed_keys)
from .scores import checked_rewards

DRAW = 0x6C696B  # a key of its own for the likelihood fitness's completions (seed, step, DRAW)


class GenerationTask(PenalisesKL, Evaluating, EngineGenerating):
    """Fine-tune a causal LM on a reward.

    Args:
        prompts: the training prompts; each step sees ``prompts_per_step`` of them, drawn by (seed, step).
        tokenizer: the model's tokenizer (a ``transformers`` tokenizer with a pad token).
        reward: ``reward(prompts, completions) -> tensor`` of one float per completion (higher is better);
            your own function, or a built-in verifier (:func:`nesgpu.tasks.verifiers.rewards_of`).
        eval_prompts: held-out prompts for :meth:`evaluate` (default: the training prompts).
        max_new_tokens: tokens each completion may have; the completion is cut at the first of ``stop``.
        temperature: 0 (default) decodes greedily; > 0 samples, seeded by (seed, step, block).
        prompts_per_step: prompts per ES step (every member answers all of them).
        shaping: "per_prompt" (each prompt's rewards standardised over the members) or "none".
        correct_at: a reward counted as a correct answer (accuracy) from this value on; None: the metric is
            the mean reward.
        generations: completions per prompt (each member's fitness is their mean reward; TRL's
            ``num_generations``); above 1 needs a temperature above 0.
        fitness: "reward" (each member's reward on its own completions) or "likelihood" (``generations``
            completions drawn from the plain model at ``temperature``, each member's fitness the reward its own
            policy expects of them, by importance weights: one teacher-forced population forward, no
            population generate; see :mod:`nesgpu.tasks.likelihood`).
        compile: the population's ``generate()`` runs a compiled static-cache decode
            (:class:`nesgpu.decode.CompiledDecode`: one graph for every decode step; the prompts are padded to
            the longest training prompt so that every step has the same shapes). The first step pays the compile
            (tens of seconds on a CPU); a later recompile is a warning. A :class:`~nesgpu.decode.CompiledDecode`
            of your own sets the mode, and shares its graphs with your other calls of the same model.
        name: the run's label (``custom:<name>``).
        data_fingerprint: a hash of the data the prompts were made from (see :meth:`data_fingerprint`).
        kl: log ``kl``, TRL's (k3) estimate of the mean per-token KL of the model from the run's starting
            model on the completions of each step's first pair of members (and ``eval_kl`` on the held-out
            completions); a run keeps the starting weights for it, on the device.
        eval_generations: K > 0 also samples K completions per held-out prompt at each evaluation and logs
            ``eval_pass@K`` and ``eval_pass@1`` (needs ``correct_at``).
        drift_texts: texts the task never trains on; each evaluation logs the model's mean negative
            log-likelihood per token of them (``drift_nll``) and its change from the starting model.
        beta: TRL's KL penalty (0: none): each member's fitness is its reward less beta times its mean per-token
            KL (k3) from the starting model on its own completions (``fitness="reward"`` only; logs
            ``kl_penalty``; see :mod:`nesgpu.tasks.kl_penalty`); a run keeps the starting weights for it.
    """

    default_target = None
    # env_steps: the tokens the step generated (every row, to the longest), which the run adds up (num_tokens);
    # the completions' lengths, counted by length (their mean, min and max: completions/mean_length, ...)
    summed_info = frozenset({"env_steps", LENGTHS})
    # what a user reads each step (the progress line, metrics.csv), under TRL's names, never the shaped fitness:
    # the raw reward's mean, std and best over the members (a member's reward: its mean over the step's prompts),
    # the share of prompts whose rewards differ across members (one whose rewards are all alike carries no
    # signal), the kept completions' mean length in tokens, and the tokens the run has generated so far
    describes = ("reward", "reward_std", "reward_best", "prompts_with_spread", "kl", "completions/mean_length",
                 "num_tokens")
    column_names = {"env_steps": "num_tokens", "lr": "learning_rate"}  # the run's own columns, under TRL's names

    def __init__(self, prompts: Sequence[str], tokenizer, reward: Callable, eval_prompts: Sequence[str] | None = None,
                 max_new_tokens: int = 16, temperature: float = 0.0, stop: Sequence[str] = ("\n",),
                 prompts_per_step: int = 8, shaping: str = "per_prompt", correct_at: float | None = 1.0,
                 seed: int = 0, eval_batch: int = 64, name: str = "generation", generations: int = 1,
                 fitness: str = "reward", compile: bool | CompiledDecode = False, data_fingerprint: str | None = None,
                 kl: bool = True, eval_generations: int = 0, drift_texts: Sequence[str] | None = None,
                 beta: float = 0.0):
        self.prompts = check_prompts(prompts, "prompts")
        self.eval_prompts = check_prompts(self.prompts if eval_prompts is None else eval_prompts, "eval_prompts")
        stop = check_arguments(tokenizer, reward, shaping, temperature, fitness, generations, compile, correct_at, stop,
                               max_new_tokens=max_new_tokens, prompts_per_step=prompts_per_step, eval_batch=eval_batch)
        if prompts_per_step > len(self.prompts):
            warnings.warn(f"prompts_per_step {prompts_per_step} is more than the {len(self.prompts)} training "
                          f"prompts: each step uses all {len(self.prompts)}", stacklevel=2)
        self.tokenizer, self.reward, self.stop = tokenizer, reward, stop
        self._reward_calls = RewardCalls()  # each call awaited, exit() refused, the working directory kept
        self.max_new_tokens, self.temperature, self.shaping = max_new_tokens, float(temperature), shaping
        self.prompts_per_step = min(prompts_per_step, len(self.prompts))
        self.correct_at, self.seed, self.eval_batch, self.name = correct_at, seed, eval_batch, name
        self.generations, self.fitness_kind = generations, fitness
        self._drawn: Drawn | None = None  # the likelihood fitness's completions of the latest step
        self.latest_step = 0  # the latest step evaluated (a TRL reward function's trainer_state.global_step)
        self.metric = "accuracy" if correct_at is not None else "mean_reward"
        self.samples: list[dict] = []  # the last evaluation's prompts, completions and rewards
        self._longest = None  # tokens of the longest training prompt, once counted
        self._fingerprint = data_fingerprint  # of the rows the prompts came from; else of the prompts themselves
        # the compiled decode: given, or made at the first population call
        self.compile, self._compiled = bool(compile), compile if isinstance(compile, CompiledDecode) else None
        self._graphs_seen: tuple[int, int] | None = None  # (step, graphs compiled by its end) of the last step
        self.reward_names = function_names(reward)
        self.summed_info = type(self).summed_info | summed_keys(self.reward_names) | frozenset(KL_KEYS) | {PENALTY}
        self.kl, self.eval_generations = check_measures(kl, eval_generations, correct_at)
        self.describes = type(self).describes if kl else tuple(k for k in type(self).describes if k != "kl")
        self.beta = check_beta(beta, fitness)
        self.describes += ("kl_penalty",) if self.beta else ()
        self.drift_texts = None if drift_texts is None else check_prompts(drift_texts, "drift_texts")
        self._evaluation: dict[str, float] = {}  # the latest evaluation's columns beside the metric

    def data_fingerprint(self) -> str:
        """A short hash of what the task trains and evaluates on: the ``data_fingerprint`` it was given (a
        dataset task's: its rows as given, before a chat template renders them), else of its training and
        held-out prompts. A checkpoint records it, and a resume on other data is refused."""
        if self._fingerprint is None:
            text = json.dumps([self.prompts, self.eval_prompts])
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._fingerprint

    # ----- the population ----------------------------------------------------------------------------
    def step_prompts(self, step: int) -> list[str]:
        """The prompts of ``step``: a function of the seed and the step only."""
        rng = random.Random(derive_seed(self.seed, step))
        return rng.sample(self.prompts, self.prompts_per_step)

    def fitness(self, pm: PerturbedModel, step: int) -> tuple[torch.Tensor, dict]:
        """Raw rewards (signs * prompts, D_local) of the drawn directions: each member's mean reward over its
        ``generations`` completions of each prompt (or, with ``fitness="likelihood"``, the reward it expects)."""
        self.latest_step = step  # what a TRL reward function reads as trainer_state.global_step
        if self.fitness_kind == "likelihood":
            return self._likelihood_fitness(pm, step)
        prompts = self.step_prompts(step)
        ids, mask = self.encode_prompts([p for p in prompts for _ in range(self.generations)], pm.model, self.compile)
        new = self.population_tokens(pm, ids, mask, step, derive_seed(self.seed, step, pm.noise_range.start))
        if self.compile:
            self._note_graphs(step)
        signs, d = (2 if pm.antithetic else 1), pm.local_directions
        row_prompts = [prompts[(n // d) // self.generations % len(prompts)] for n in range(new.shape[0])]
        # the members repeat one another's completions: each distinct row of tokens is decoded and counted once
        distinct, row_of = torch.unique(new.cpu(), dim=0, return_inverse=True)
        row_of = row_of.tolist()
        texts = self.decode_tokens(distinct)
        lengths = [len(t) for t in self.tokenizer(texts, add_special_tokens=False).input_ids]
        completions = [texts[i] for i in row_of]
        kept = kept_tokens(self.tokenizer, distinct, self.stop) if self.beta else None  # once, for both readers
        scored = self.score_completions(row_prompts, completions, distinct, row_of, kept)
        rewards = pm.by_member(scored.to(ids.device))  # (S, P*K, D)
        # sorted first: members whose samples scored the same values in another order tie exactly, not to rounding
        fitness = rewards.view(signs, len(prompts), self.generations, d).sort(2).values.mean(2)
        fitness = fitness.reshape(signs * len(prompts), d)
        clipped = clipped_ratio(lengths, row_of, self.max_new_tokens)
        return fitness, {LENGTHS: length_counts([lengths[i] for i in row_of], self.max_new_tokens, ids.device),
                         "env_steps": torch.tensor(new.numel(), device=ids.device),
                         "completions/clipped_ratio": torch.tensor(clipped, device=ids.device),
                         **function_sums(self.reward, scored.to(ids.device), self.reward_names),
                         **self.step_kl(pm, ids, mask, new),
                         **self.penalty_info(pm, ids, mask, new, kept, row_of)}

    def _likelihood_fitness(self, pm: PerturbedModel, step: int) -> tuple[torch.Tensor, dict]:
        """Every member's expected reward on the step's completions, drawn once (every block and process of
        the step draws the same, from the plain model under (seed, step))."""
        generated = 0
        if self._drawn is None or self._drawn.step != step:
            self._drawn = self._draw(pm.model, self.step_prompts(step), step)
            # every process draws the step's completions alike: counted once, by the one with the first direction
            generated = self._drawn.kept.numel() if pm.noise_range.start == 0 else 0
        drawn, signs = self._drawn, (2 if pm.antithetic else 1)
        varied, rows = drawn.varied()
        fitness = drawn.constant_fitness(signs, pm.local_directions)
        if rows.numel():  # a prompt whose completions all scored alike needs no forward: each member expects that
            with pm.perturbing():
                logp = sequence_logp(pm.model, pm.member_rows(drawn.ids[rows]), pm.member_rows(drawn.mask[rows]),
                                     pm.member_rows(drawn.kept[rows]), self.temperature)
            at = drawn.base.device  # the logits' device: another than the ids' where a model spans devices
            weighted = importance_weighted(pm.by_member(logp).to(at), drawn.base[rows.to(at)],
                                           drawn.rewards.to(drawn.base)[varied.to(at)])
            weighted = weighted.view(signs, varied.numel(), -1).to(fitness)
            fitness.view(signs, drawn.rewards.shape[0], -1)[:, varied] = weighted
        lengths = drawn.kept.sum(1) if generated else []  # counted once, as the tokens are
        return fitness, {LENGTHS: length_counts(lengths, self.max_new_tokens, drawn.ids.device),
                         "env_steps": torch.tensor(generated, device=drawn.ids.device),
                         **self.drawn_kl(pm, drawn)}

    @torch.no_grad()
    def _draw(self, model: nn.Module, prompts: list[str], step: int) -> Drawn:
        """``generations`` completions of each prompt from the plain model, their rewards and log-likelihoods."""
        rows = [p for p in prompts for _ in range(self.generations)]
        ids, mask = self.encode_prompts(rows, model)
        new = self.generate_tokens(model, ids, mask, derive_seed(self.seed, step, DRAW))
        kept = kept_tokens(self.tokenizer, new.cpu(), self.stop).to(ids.device)
        rewards = self.score_completions(rows, self.decode_tokens(new), new, kept=kept)
        rewards = rewards.view(len(prompts), self.generations)
        ids, mask = joined(ids, mask, new, kept, self.tokenizer.pad_token_id)
        return Drawn(step, ids, mask, kept, rewards, sequence_logp(model, ids, mask, kept, self.temperature))

    def describe(self, fitness: torch.Tensor) -> dict[str, torch.Tensor]:
        """The raw rewards (signs * prompts, D) of the whole population: their mean, the std and best of the
        members' rewards, and the share of the step's prompts whose rewards are not all alike."""
        signs = fitness.shape[0] // self.prompts_per_step
        members = fitness.view(signs, self.prompts_per_step, -1).mean(1).flatten()
        by_prompt = self._by_prompt(fitness)
        spread = (by_prompt.amax(1) > by_prompt.amin(1)).to(fitness.dtype).mean()
        return {"reward": members.mean(), "reward_std": members.std(unbiased=False),
                "reward_best": members.max(), "prompts_with_spread": spread, "frac_reward_zero_std": 1 - spread}

    def shape(self, fitness: torch.Tensor) -> torch.Tensor:
        """Per-prompt shaping of the whole population's fitness (after the exchange between processes): each
        prompt's rewards standardised over both signs and every direction (a prompt all members answer
        alike contributes nothing). With ``beta``, beta x each member's KL is subtracted after (see
        :mod:`nesgpu.tasks.kl_penalty`)."""
        if self.penalty_pending:
            return self.penalised(fitness)
        if self.shaping == "none":
            return fitness
        signs = fitness.shape[0] // self.prompts_per_step
        by_prompt = self._by_prompt(fitness)
        mean, std = by_prompt.mean(1, keepdim=True), by_prompt.std(1, unbiased=False, keepdim=True)
        # a prompt whose members all tie gives exactly zero: their mean can differ from them in the last bit, and
        # so their std from zero, which the division would turn into a full-weight random fitness
        varied = by_prompt.amax(1, keepdim=True) > by_prompt.amin(1, keepdim=True)
        shaped = torch.where(varied, (by_prompt - mean) / std.clamp_min(1e-12), torch.zeros_like(by_prompt))
        return shaped.view(self.prompts_per_step, signs, -1).transpose(0, 1).reshape(fitness.shape)

    def _by_prompt(self, fitness: torch.Tensor) -> torch.Tensor:
        """(signs * prompts, D) -> (prompts, signs * D): each prompt's rewards over every member."""
        signs = fitness.shape[0] // self.prompts_per_step
        return fitness.view(signs, self.prompts_per_step, -1).transpose(0, 1).reshape(self.prompts_per_step, -1)

    def activation_bytes(self, pm: PerturbedModel) -> int:
        """Bytes the rows of one direction take in ``generate()``, which ``chunk="auto"`` counts: for each of
        its signs x prompts x generations rows, the KV cache of the longest prompt and the new tokens, one
        layer's activations over those tokens, and one token's logits in float32 (the likelihood fitness: the
        logits of every new token and one more, twice, for their log-softmax; with ``beta``, also one prompt's rows'
        logits of them, three times, in the KL penalty's forwards) (0 for a model without a ``transformers`` config)."""
        config = getattr(pm.model, "config", None)
        return self.activation_bytes_of(config, next(pm.model.parameters()).element_size(), pm.antithetic)

    def activation_bytes_of(self, config, size: int, antithetic: bool) -> int:
        """:meth:`activation_bytes` from a ``transformers`` config and the weights' bytes per entry ``size``, before
        the model is loaded (the memory plan's)."""
        if config is None or not hasattr(config, "num_hidden_layers"):
            return 0
        heads, hidden = config.num_attention_heads, config.hidden_size
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        tokens = self._longest_prompt() + self.max_new_tokens
        cache = 2 * config.num_hidden_layers * kv_heads * head_dim * tokens * size
        layer = tokens * (4 * hidden + 2 * (getattr(config, "intermediate_size", None) or 4 * hidden)) * size
        rows = (2 if antithetic else 1) * self.prompts_per_step * self.generations
        positions = self.max_new_tokens + 1 if self.fitness_kind == "likelihood" else 1
        # the penalty's forwards take whole prompts' rows, as many as stay below divergence.LOGITS_BYTES (at least one)
        penalty = (2 if antithetic else 1) * 3 * (self.max_new_tokens + 1) * config.vocab_size * 4 if self.beta else 0
        return rows * (cache + layer + 2 * positions * config.vocab_size * 4) + penalty

    def check_context(self, context: int | None, longest: int | None = None) -> None:
        """Refuse prompts of ``longest`` tokens (default: the longest training or held-out prompt, counted before
        the model is loaded) that with ``max_new_tokens`` exceed a model's context of ``context`` tokens (None: no
        context known)."""
        if context is None:
            return
        if longest is None:
            longest = max(self._longest_prompt(), max(len(ids) for ids in self.tokenizer(self.eval_prompts).input_ids))
        if longest + self.max_new_tokens > context:
            raise ValueError(f"prompts of {longest} tokens and max_new_tokens {self.max_new_tokens} exceed the "
                             f"model's context of {context} tokens; shorten them")

    def _longest_prompt(self) -> int:
        """Tokens of the longest training prompt (counted once)."""
        if self._longest is None:
            self._longest = max(len(ids) for ids in self.tokenizer(self.prompts).input_ids)
        return self._longest

    def _note_graphs(self, step: int) -> None:
        """Warn when the compiled decode compiles again after the first step it ran: its shapes changed (they
        are fixed: the step's rows and the prompts padded to one length), so each step would pay a compile."""
        graphs, seen = self._compiled.graphs, self._graphs_seen
        if seen is not None and step != seen[0] and graphs > seen[1]:
            warnings.warn(f"the compiled decode compiled {graphs - seen[1]} more graph(s) at step {step} "
                          f"({graphs} in all): its batch shapes changed after the first step", stacklevel=3)
        self._graphs_seen = (step, graphs)

    def finish_step(self, pm: PerturbedModel, info: dict) -> None:
        """Nothing carries over between steps; in ``info``, the step's summed rewards per function become their
        mean and std, and its length counts the completions' mean, min and max length (and with ``beta`` the
        members' KL is kept for :meth:`shape`)."""
        self.keep_penalty(info)
        if f"rewards/{self.reward_names[0]}/sum" in info:
            info.update(function_columns(info, self.reward_names))
        if KL_KEYS[0] in info:
            total, tokens = (info.pop(key) for key in KL_KEYS)
            info["kl"] = torch.as_tensor(total) / torch.as_tensor(tokens)
        if LENGTHS in info:
            info.update(length_columns(info.pop(LENGTHS)))

    def logged_metrics(self) -> dict[str, float]:
        """What the reward functions gave TRL's ``log_metric`` since the last call, each name's mean."""
        take = getattr(self.reward, "take_metrics", None)
        held, self._held_metrics = self._held_metrics or {}, None
        return {**held, **(take() if callable(take) else {})}

    # ----- pieces ------------------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str], model: nn.Module,
                       fixed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and mask, left-padded to the longest prompt given, or with ``fixed`` to the longest training
        prompt (one shape every step: a compiled decode does not recompile)."""
        if fixed:
            enc = self.tokenizer(prompts, return_tensors="pt", padding="max_length", max_length=self._longest_prompt(),
                                 padding_side="left")
        else:
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
        self.check_context(getattr(getattr(model, "config", None), "max_position_embeddings", None),
                           enc.input_ids.shape[1])
        device = next(model.parameters()).device
        return enc.input_ids.to(device), enc.attention_mask.to(device)

    def generate_tokens(self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, seed: int | None,
                        compiled: bool = False, temperature: float | None = None) -> torch.Tensor:
        """The new tokens of every row (rows, max_new_tokens), greedy or sampled under ``seed``; ``compiled``:
        through the compiled static-cache decode."""
        options = dict(max_new_tokens=self.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id)
        if compiled:
            if self._compiled is None or self._graphs_seen is None:
                check_compilable(model)  # before the first compile
            if self._compiled is None:
                self._compiled = CompiledDecode(ids.device)
            options.update(self._compiled.options)
        temperature = self.temperature if temperature is None else temperature
        if not (temperature > 0 and seed is not None):
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, temperature=None, top_p=None,
                                 top_k=None, **options)
            return out[:, ids.shape[1]:]
        with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []):
            torch.manual_seed(seed)  # the caller's RNG stays as it was
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature,
                                 top_k=0, **options)
        return out[:, ids.shape[1]:]

    def decode_tokens(self, tokens: torch.Tensor) -> list[str]:
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        for stop in self.stop:
            texts = [t.split(stop, 1)[0] for t in texts]
        return texts

    def score_completions(self, prompts: list[str], completions: list[str], tokens: torch.Tensor,
                          row_of: list[int] | None = None, kept: torch.Tensor | None = None,
                          evaluating: bool = False) -> torch.Tensor:
        """The reward function's values, checked: a tensor of one finite float per completion. ``tokens``: the
        completions' new tokens (rows ``row_of`` of them, when given; ``kept``: their kept_tokens, if known); a
        reward that ``takes_context`` (:class:`~nesgpu.tasks.reward_data.Rewards`) gets their ids, the step
        and whether it scores an evaluation where it takes them."""
        wanted, context = getattr(self.reward, "takes_context", frozenset()), {}
        wanted = wanted if isinstance(wanted, frozenset) else frozenset()
        if "completion_ids" in wanted:
            context["completion_ids"] = CompletionIds(self.tokenizer, tokens, self.stop, row_of, kept)
        if "step" in wanted:
            context["step"] = self.latest_step
        if "evaluating" in wanted:
            context["evaluating"] = evaluating
        # copies: samples.jsonl keeps what was made; an error is named as the function's own (see RewardCalls)
        rewards = self._reward_calls(self.reward, list(prompts), list(completions), **context)
        return checked_rewards(rewards, completions)


__all__ = ["FITNESSES", "GenerationTask", "REWARD_SHAPINGS"]
