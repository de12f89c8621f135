"""Where a generation task's population generates: transformers' ``generate()`` on the population rows (the
"hf" engine), or one vLLM engine in this process whose members are LoRA adapters (the "vllm" engine, see
:mod:`nesgpu.engines`). Both give the new tokens of every row, laid out (sign, prompt, direction) and padded after
a row's end with the pad token, so that the task scores them alike."""

from __future__ import annotations

import os
import warnings

import torch
from torch.nn.utils.rnn import pad_sequence

from ..engines.adapters import adapter_config, lora_refusal, member_adapters
from ..model import PerturbedModel
from ..noise import derive_seed

ENGINES = ("hf", "vllm")


def check_engine(engine: str, fitness: str, compile: object) -> str:
    """``engine`` is one of ENGINES, and the vLLM engine has completions to generate."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}; got {engine!r}")
    if engine == "vllm" and fitness != "reward":
        raise ValueError(f"--engine vllm generates the members' completions; --fitness {fitness} generates none from "
                         f"the members: drop one")
    if engine == "vllm" and compile:
        raise ValueError("--engine vllm generates through vLLM; --compile on compiles transformers' decode: drop one")
    world = os.environ.get("WORLD_SIZE", "1")
    if engine == "vllm" and world != "1" and torch.cuda.is_available():  # vLLM's engine takes the rank's first GPU
        raise ValueError(f"--engine vllm under torchrun (WORLD_SIZE={world}) runs on CPUs only for now: every "
                         f"rank's engine would start on the first GPU; run one process, or use --engine hf")
    return engine


class EngineGenerating:
    """A generation task's population generate, through its ``engine`` ("hf" or "vllm"; ``engine_model``: the
    model directory vLLM loads). The vLLM engine is made at the first call. Where every member is a LoRA
    adapter (low-rank noise on the projections alone), one call generates them all; else each member's weights
    are written into the engine in turn (slow), and the model's restored after. The engine's weights are
    written from the trainer's model once per step."""

    engine: str = "hf"
    engine_model: str | None = None

    def population_tokens(self, pm: PerturbedModel, ids: torch.Tensor, mask: torch.Tensor, step: int,
                          seed: int) -> torch.Tensor:
        """Every member's new tokens for the prompts ``ids`` (left-padded, ``mask``): (rows, new tokens)."""
        if self.engine == "hf":
            with pm.perturbing():
                return self.generate_tokens(pm.model, pm.member_rows(ids), pm.member_rows(mask), seed, self.compile)
        sampling = vllm_sampling(pm.model, self.temperature)
        engine, names = self._vllm_engine(pm)
        weights = _perturbed(pm)
        if getattr(self, "_synced", None) != (id(pm), step):  # the weights an update changed, before its members
            engine.load_weights(weights.items())
            self._synced = (id(pm), step)
        prompts = [row[keep.bool()].tolist() for row, keep in zip(ids.cpu(), mask.cpu())]
        signs, d = (2 if pm.antithetic else 1), pm.local_directions
        seeds = [derive_seed(seed, n) for n in range(signs * len(prompts) * d)] if self.temperature > 0 else None
        if names is not None:
            adapters = member_adapters(pm, names)
            self._plain = [{key: torch.zeros_like(value) for key, value in adapters[0].items()}]  # a zero adapter
            engine.set_members(adapters, adapter_config(names, pm.layers[names[0]].kind.rank))
            rows = [prompts[n // d % len(prompts)] for n in range(signs * len(prompts) * d)]
            members = [n // (len(prompts) * d) * d + n % d for n in range(len(rows))]
            new = engine.generate(rows, members, self.max_new_tokens, self.temperature, seeds, sampling=sampling)
        else:
            new = self._one_member_at_a_time(engine, pm, weights, prompts, seeds, sampling)
        return self._padded(new, ids)

    def plain_tokens(self, model, ids: torch.Tensor, mask: torch.Tensor, seed: int | None,
                     temperature: float | None = None) -> torch.Tensor:
        """The plain model's new tokens of the prompts ``ids`` (an evaluation's), greedy or sampled under ``seed``:
        on the vLLM engine where ``model`` is the one it shares weights with (after the first population call),
        else through transformers."""
        engine = getattr(self, "_engine", None)
        if engine is None or model is not getattr(self, "_shared", None):
            return self.generate_tokens(model, ids, mask, seed, temperature=temperature)
        engine.load_weights((name, model.get_parameter(name)) for name in self._written)  # as the update left them
        temperature = self.temperature if temperature is None else temperature
        prompts = [row[keep.bool()].tolist() for row, keep in zip(ids.cpu(), mask.cpu())]
        seeds = [derive_seed(seed, n) for n in range(len(prompts))] if temperature > 0 and seed is not None else None
        members = None
        if self._engine_lora:  # every row names an adapter (vLLM's CPU LoRA): a zero one is the plain model, exactly
            engine.set_members(self._plain, self._adapter_config)
            members = [0] * len(prompts)
        new = engine.generate(prompts, members, self.max_new_tokens, temperature if seeds else 0.0, seeds,
                              sampling=vllm_sampling(model, temperature))
        return self._padded(new, ids)

    def _padded(self, new: list[list[int]], ids: torch.Tensor) -> torch.Tensor:
        return pad_sequence([torch.tensor(tokens, dtype=ids.dtype) for tokens in new], batch_first=True,
                            padding_value=self.tokenizer.pad_token_id).to(ids.device)

    def _one_member_at_a_time(self, engine, pm: PerturbedModel, weights: dict, prompts: list, seeds,
                              sampling: dict) -> list:
        """Each member's tokens, its weights (theta + s sigma z_d) written into the engine in turn, a module at a
        time (its dense noise of every direction: the memory of D copies of the largest module); the rows laid out
        (sign, prompt, direction). The engine holds the model's weights again after; while the members generate,
        the process holds a copy of the perturbed weights to write them back from."""
        signs, d, p = ((1.0, -1.0) if pm.antithetic else (1.0,)), pm.local_directions, len(prompts)
        new: list = [None] * (len(signs) * p * d)
        weights = {name: value.clone() for name, value in weights.items()}  # the engine's are the model's (share)
        try:
            for i, sign in enumerate(signs):
                for k in range(d):
                    for name, layer in pm.layers.items():
                        if layer.perturbs:
                            member = {_full(name, slot): z[k] for slot, z in layer.dense_noise().items()}
                            engine.load_weights((full, weights[full] + (sign * pm.sigma) * z.to(weights[full]))
                                                for full, z in member.items())
                    rows = [i * p * d + j * d + k for j in range(p)]
                    out = engine.generate(prompts, None, self.max_new_tokens, self.temperature,
                                          None if seeds is None else [seeds[n] for n in rows], sampling=sampling)
                    for n, tokens in zip(rows, out):
                        new[n] = tokens
        finally:
            engine.load_weights(weights.items())
        return new

    def _vllm_engine(self, pm: PerturbedModel):
        """The vLLM engine (made at the first call, for the longest prompt), and the modules whose noise
        the members carry as LoRA adapters (None: the members are written in place, one at a time)."""
        why = lora_refusal(pm)
        names = None if why else [name for name, layer in pm.layers.items() if layer.perturbs]
        engine = getattr(self, "_engine", None)
        if engine is not None and self._engine_lora != (names is not None):
            raise ValueError("--engine vllm: this task's engine was made for members as LoRA adapters or written in "
                             "place, and this model's members are the other kind: one engine serves one run")
        if engine is None:
            from ..engines.vllm_engine import VLLMEngine

            if self.engine_model is None:
                raise ValueError("--engine vllm loads the model from its directory: give the task engine_model")
            if why:
                warnings.warn(f"--engine vllm: {why}; the members generate one at a time instead, each written into "
                              f"the engine's weights (slow)", stacklevel=3)
            _check_writable(pm)
            dtype = str(next(pm.model.parameters()).dtype).removeprefix("torch.")
            prompts = [*self.prompts, *(getattr(self, "eval_prompts", None) or ())]  # the evaluations' too
            longest = max(len(row) for row in self.tokenizer(prompts).input_ids)
            members = 0 if why else (2 if pm.antithetic else 1) * pm.local_directions
            rank = 1 if why else pm.layers[names[0]].kind.rank
            engine = VLLMEngine(str(self.engine_model), members=members, rank=rank, dtype=dtype, seed=self.seed,
                                max_model_len=longest + self.max_new_tokens, weights=pm.model)
            for full in _perturbed(pm):
                engine.parameter(full)  # every weight the members change has its place in the engine
            if engine.apart:
                warnings.warn(f"--engine vllm holds {len(engine.apart)} of the model's weights in another dtype, "
                              f"layout or device ({engine.apart[0]!r} first): the process holds those twice, the "
                              f"engine's written from the model's where the members change them", stacklevel=3)
            self._engine, self._engine_lora, self._shared = engine, names is not None, pm.model
            self._written = [name for name in _perturbed(pm) if name in engine.apart]  # not shared: written in
            self._adapter_config = adapter_config(names, rank) if names else None
        return engine, names


def _perturbed(pm: PerturbedModel) -> dict[str, torch.Tensor]:
    """The model's perturbed parameters by their full names (what an update changes)."""
    return {_full(name, slot.name): layer.get_parameter(slot.name)
            for name, layer in pm.layers.items() if layer.perturbs for slot in layer.perturbation.slots}


def _full(module: str, parameter: str) -> str:
    return f"{module}.{parameter}" if module else parameter


def _check_writable(pm: PerturbedModel) -> None:
    """Every perturbed parameter is stored as vLLM loads it: not transposed (GPT-2's Conv1D), not a bank of
    experts."""
    for name, layer in pm.layers.items():
        state = layer.perturbation
        if layer.perturbs and (state.transposed or state.banks):
            raise ValueError(f"module {name!r} ({type(layer).__name__}) stores its weights transposed or as a bank of "
                             f"experts, which --engine vllm cannot write into vLLM's model: use --engine hf")


# generation_config settings transformers' generate() applies that vLLM's SamplingParams would not apply alike (the
# repetition penalty: transformers' counts the left padding of a batch's prompts too; a member's greedy tokens
# differed between the two engines under 1.5)
UNSERVED = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
            "forced_bos_token_id", "forced_eos_token_id", "min_new_tokens", "typical_p", "epsilon_cutoff",
            "eta_cutoff", "min_p")


def vllm_sampling(model, temperature: float) -> dict:
    """What the model's generation_config adds to transformers' decoding, as vLLM's SamplingParams: top_p when
    sampling. A setting vLLM would not apply alike is a ValueError naming it."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return {}
    for name in UNSERVED:
        value = getattr(config, name, None)
        if value not in (None, 0, 0.0, 1.0, [], ()):
            raise ValueError(f"the model's generation_config sets {name}={value!r}, which --engine vllm does not "
                             f"apply as transformers' generate() does: use --engine hf, or drop it from "
                             f"generation_config.json")
    sampling = {}
    if temperature > 0 and getattr(config, "top_p", None) not in (None, 1.0):
        sampling["top_p"] = float(config.top_p)
    return sampling


__all__ = ["ENGINES", "EngineGenerating", "check_engine"]
