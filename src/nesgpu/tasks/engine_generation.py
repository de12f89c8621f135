"""Where a generation task's population generates: transformers' ``generate()`` on the population rows (the
"hf" engine), or one vLLM engine in this process whose members are LoRA adapters (the "vllm" engine, see
:mod:`nesgpu.engines`). Both give the new tokens of every row, laid out (sign, prompt, direction) and padded after
a row's end with the pad token, so that the task scores them alike."""

from __future__ import annotations

import torch

from ..engines.adapters import adapter_config, check_members, member_adapters
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
    return engine


class EngineGenerating:
    """A generation task's population generate, through its ``engine`` ("hf" or "vllm"; ``engine_model``: the
    model directory vLLM loads). The vLLM engine is made at the first call, for that call's members, and its
    weights are written from the trainer's model once per step."""

    engine: str = "hf"
    engine_model: str | None = None

    def population_tokens(self, pm: PerturbedModel, ids: torch.Tensor, mask: torch.Tensor, step: int,
                          seed: int) -> torch.Tensor:
        """Every member's new tokens for the prompts ``ids`` (left-padded, ``mask``): (rows, new tokens)."""
        if self.engine == "hf":
            with pm.perturbing():
                return self.generate_tokens(pm.model, pm.member_rows(ids), pm.member_rows(mask), seed, self.compile)
        engine, names = self._vllm_engine(pm)
        if getattr(self, "_synced_step", None) != step:  # the weights an update changed, before the step's members
            engine.load_weights((f"{name}.weight", pm.model.get_submodule(name).weight) for name in names)
            self._synced_step = step
        engine.set_members(member_adapters(pm, names), adapter_config(names, pm.layers[names[0]].kind.rank))
        prompts = [row[keep.bool()].tolist() for row, keep in zip(ids.cpu(), mask.cpu())]
        signs, d = (2 if pm.antithetic else 1), pm.local_directions
        rows = [prompts[n // d % len(prompts)] for n in range(signs * len(prompts) * d)]
        members = [n // (len(prompts) * d) * d + n % d for n in range(len(rows))]
        seeds = [derive_seed(seed, n) for n in range(len(rows))] if self.temperature > 0 else None
        new = engine.generate(rows, members, self.max_new_tokens, self.temperature, seeds)
        out = torch.full((len(new), max(map(len, new))), self.tokenizer.pad_token_id, dtype=ids.dtype)
        for n, tokens in enumerate(new):
            out[n, :len(tokens)] = torch.tensor(tokens, dtype=ids.dtype)
        return out.to(ids.device)

    def _vllm_engine(self, pm: PerturbedModel):
        """The vLLM engine (made at the first call, for the longest training prompt) and the modules whose noise
        the members carry."""
        names = check_members(pm)
        engine = getattr(self, "_engine", None)
        if engine is None:
            from ..engines.vllm_engine import VLLMEngine

            if self.engine_model is None:
                raise ValueError("--engine vllm loads the model from its directory: give the task engine_model")
            dtype = str(next(iter(pm.parameters())).dtype).removeprefix("torch.")
            longest = max(len(row) for row in self.tokenizer(list(self.prompts)).input_ids)
            engine = VLLMEngine(str(self.engine_model), members=(2 if pm.antithetic else 1) * pm.local_directions,
                                rank=pm.layers[names[0]].kind.rank, dtype=dtype, seed=self.seed,
                                max_model_len=longest + self.max_new_tokens)
            self._engine = engine
        return engine, names


__all__ = ["ENGINES", "EngineGenerating", "check_engine"]
