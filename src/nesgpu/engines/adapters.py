"""A low-rank member as a LoRA adapter: the noise of direction d at sign s is ``s sigma A_d B_d^T`` on each
perturbed matrix (A_d: out x r, already divided by sqrt(r); B_d: in x r; see :mod:`nesgpu.kinds.lowrank`), which is
the LoRA update ``lora_B @ lora_A`` with ``lora_A = B_d^T`` (r x in) and ``lora_B = s sigma A_d`` (out x r) at
scaling 1 (``lora_alpha = r``). An inference engine that batches LoRA adapters (vLLM) then generates every
member of the population in one call.

Only what an engine's LoRA can carry is a member here: the weights of Linear projections (q/k/v/o, gate/up/down,
an untied output head) with low-rank noise. A perturbed norm, bias or embedding, another noise kind, or a sigma per
parameter would make the engine's member another model than the trainer's: an error that names the module.
"""

from __future__ import annotations

import torch
from torch import nn

from ..model import PerturbedModel

# the module names (their last part) whose weight an engine's LoRA adapts: the decoder's projections and the head
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
PREFIX = "base_model.model."  # PEFT's key prefix of an adapter's tensors


def check_members(pm: PerturbedModel) -> list[str]:
    """The names of the modules whose noise the members carry, each a LoRA target with low-rank noise on its
    weight alone. Anything else perturbed is a ValueError naming the module (:func:`lora_refusal`)."""
    why = lora_refusal(pm)
    if why:
        raise ValueError(why)
    return [name for name, layer in pm.layers.items() if layer.perturbs]


def lora_refusal(pm: PerturbedModel) -> str | None:
    """Why the members of ``pm`` are no LoRA adapters (the first module an adapter cannot carry), or None."""
    if not isinstance(pm, PerturbedModel):
        raise TypeError(f"expected a PerturbedModel; got {type(pm).__name__}")
    perturbed = [(name, layer) for name, layer in pm.layers.items() if layer.perturbs]
    if not perturbed:
        return "the model perturbs no module: there is no member to generate"
    for name, layer in perturbed:
        why = _unsupported(name, layer)
        if why:
            return f"module {name!r} ({type(layer).__name__}) {why}: a LoRA adapter cannot carry it"
    return None


def _unsupported(name: str, layer: nn.Module) -> str | None:
    """Why ``layer``'s noise is no LoRA adapter, and what would make it one (None: it is one)."""
    state = layer.perturbation
    if name.rpartition(".")[2] not in TARGETS:
        return (f"is perturbed and is not one of the projections {list(TARGETS)}: evolve only the projections "
                f"(--evolve matrices, or convert(..., evolve='matrices'))")
    if layer.kind.name != "lowrank":
        return f"takes {layer.kind.name!r} noise, not low-rank (--layer lowrank)"
    if sorted(slot.name for slot in state.slots) != ["weight"] or state.transposed or state.banks or state.borrowed:
        return (f"perturbs {sorted(slot.name for slot in state.slots)}, not its (out, in) weight alone (--evolve "
                f"matrices)")
    if state.scales:
        return "has a sigma per parameter (a strategy that adapts one, as SNES does)"
    return None


def member_adapters(pm: PerturbedModel, names: list[str] | None = None) -> list[dict[str, torch.Tensor]]:
    """Every member of the current noise as a LoRA adapter's tensors (PEFT names, float32), in the order of the
    population's rows: sign (+ then -, with antithetic sampling), then direction."""
    names = check_members(pm) if names is None else names
    signs = (1.0, -1.0) if pm.antithetic else (1.0,)
    members: list[dict[str, torch.Tensor]] = [{} for _ in range(len(signs) * pm.local_directions)]
    for name in names:
        layer = pm.layers[name]
        noise = layer.perturbation.noise["weight"]
        a, b = noise["a"].float(), noise["b"].float()  # (D, r, out), (D, r, in)
        key = PREFIX + name
        for i, sign in enumerate(signs):
            scaled = a.transpose(1, 2) * (sign * pm.sigma)  # (D, out, r)
            for d in range(pm.local_directions):
                member = members[i * pm.local_directions + d]
                member[f"{key}.lora_A.weight"] = b[d]  # views: an engine copies what it keeps
                member[f"{key}.lora_B.weight"] = scaled[d]
    return members


def adapter_config(names: list[str], rank: int) -> dict:
    """The PEFT config of the adapters :func:`member_adapters` makes (scaling 1)."""
    return {"r": rank, "lora_alpha": rank, "target_modules": sorted({n.rpartition(".")[2] for n in names}),
            "bias": "none", "peft_type": "LORA", "task_type": "CAUSAL_LM"}


__all__ = ["PREFIX", "TARGETS", "adapter_config", "check_members", "lora_refusal", "member_adapters"]
