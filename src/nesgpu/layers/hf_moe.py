"""transformers' MoE module types: routers (a ``weight`` (E, H) used as ``F.linear(tokens, weight)``, maybe
cast or transposed first, maybe with a ``bias``) and expert banks (``gate_up_proj`` (E, 2I, H), ``down_proj``
(E, H, I): Qwen3-MoE's, Mixtral's; stored (E, H, 2I) with biases and the family's own gate: GPT-OSS's; ``up_proj``
without a gate: Nemotron-H's). The bank sees tokens flattened as (rows * T, H); token j belongs to population
row j // T."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Geometry, Kind
from .base import PerturbedModule
from .form import ConversionOptions, Form
from .guarded_value import GuardedValue
from .guarded_forward import GuardedForward
from .layout import compute_dtype, member_tokens
from .swap import swap_class


class Bank(NamedTuple):
    """How an expert bank stores its experts: the first matrix's name (``gate_up_proj``, or ``up_proj`` without
    a gate), whether each matrix is stored (in, out) (GPT-OSS's), whether each has a bias ``<name>_bias``, and
    its gate: "act" (no gate: ``act_fn``), "own" (the class's ``_apply_gate``: transformers' default or the
    family's own) or "chunk" (``act_fn(gate) * up`` of the halves)."""

    first: str
    transposed: bool
    bias: bool
    gate: str


class PerturbedExperts(PerturbedModule):
    """A bank of MoE experts, ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I) (or each matrix stored
    (in, out); or ``up_proj`` without a gate; maybe with per-expert biases), each expert matrix and bias with
    its own noise; forward(hidden (N, H), top_k_index (N, k), top_k_weights (N, k)) as transformers' eager
    experts, with the module's own ``_apply_gate`` (GPT-OSS's clamped, interleaved GLU). Tokens are the
    population rows flattened: N = rows * T."""

    bank: Bank

    def population_forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
        n, tokens = hidden.shape[0], member_tokens(self.population_layout, hidden, self.label, self.layer_name)
        pop = self.population_of(n // tokens, compute_dtype(hidden), hidden.device)
        row = torch.arange(n, device=hidden.device) // tokens
        direction, scale = row % pop.directions, pop.scale[row // pop.directions]
        out = torch.zeros_like(hidden)
        for expert in range(self.num_experts):
            position, token = torch.where((top_k_index == expert).t())
            if token.numel() == 0:
                continue
            h = self._expert_linear(self.bank.first, expert, hidden[token], direction[token], scale[token])
            h = self._expert_linear("down_proj", expert, self._activation(h), direction[token], scale[token])
            out.index_add_(0, token, (h * top_k_weights[token, position, None]).to(out.dtype))
        return out

    def _activation(self, h: torch.Tensor) -> torch.Tensor:
        if self.bank.gate == "act":
            return self.act_fn(h)
        if self.bank.gate == "own":
            return self._apply_gate(h)
        gate, up = h.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def _expert_linear(self, name, expert, x, direction, scale) -> torch.Tensor:
        w = self.get_parameter(name)[expert]
        y = x @ w if self.bank.transposed else F.linear(x, w)
        if self.bank.bias:
            bias = f"{name}_bias"
            y = y + self.get_parameter(bias)[expert]
            noise = self.noise_of(bias, y.dtype)
            if noise is not None:
                y.addcmul_(noise["z"][direction, expert], scale.to(y.dtype).unsqueeze(-1))
        noise = self.noise_of(name, y.dtype)
        if noise is not None:
            self.slot_of(name).kind.experts_(x.to(y.dtype), y, scale.to(y.dtype), direction, noise, expert)
        return y


_TRANSPOSES = frozenset({torch.Tensor.t, torch.Tensor.transpose, torch.Tensor.T.__get__, torch.Tensor.mT.__get__})
_MATMULS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__})


class PerturbedRouter(GuardedForward):
    """An MoE router (a ``weight`` (E, H) used as ``F.linear(tokens, weight)`` or ``tokens @ weight.t()``,
    maybe cast first: ``weight.float()``, ``.to(dtype)``, ``.type(dtype)``): its own forward, with every
    member's logits from the kind's linear product over that member's tokens. Any other use of the matrix is an error.

    Shape: tokens (rows * T, H) or (rows, ..., H), as the library's routers see them.
    """

    def own_use(self, guard, func, args, kwargs):
        swaps = func is not torch.Tensor.transpose or sorted(d % 2 for d in args[1:3]) == [0, 1]
        if func in _TRANSPOSES and args[0] is guard and guard.dim() == 2 and swaps:
            return guard.transpose_view()
        plain_input = len(args) >= 2 and not isinstance(args[0], type(guard))
        if func is F.linear and plain_input and args[1] is guard and not guard.transposed:
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            own_bias = isinstance(bias, GuardedValue) and bias.owner is self and bias.attr == "bias"
            if isinstance(bias, GuardedValue) and not (own_bias and bias.dtype == guard.dtype):
                return NotImplemented
            return self.token_linear(args[0], None if own_bias else bias, guard.dtype, own_bias)
        if func in _MATMULS and plain_input and args[1] is guard and guard.transposed:  # tokens @ weight.t()
            return self.token_linear(args[0], None, guard.dtype)
        return NotImplemented

    def token_linear(self, x: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                     own_bias: bool = False) -> torch.Tensor:
        """``F.linear(x, weight.to(dtype), bias)`` for every member over its own tokens; with ``own_bias``, the
        router's own (perturbed) bias."""
        with self.own_call():
            n, tokens = x.shape[0], member_tokens(self.population_layout, x, self.label, self.layer_name)
            rows = n // tokens
            per_row = x if tokens == 1 else x.view(rows, tokens, x.shape[-1])
            pop = self.population_of(rows, compute_dtype(per_row), x.device)
            bias = self.bias.to(dtype) if own_bias else bias
            y = F.linear(per_row, self.weight.to(dtype), bias)
            y = self.perturbed_linear(per_row, pop, "weight", "bias" if own_bias else None, y=y)
            return y.view(*x.shape[:-1], -1)


def is_router(module: nn.Module) -> bool:
    params = dict(module.named_parameters())
    weight, bias = params.get("weight"), params.get("bias")
    return ("router" in type(module).__name__.lower() and sorted(params) in (["weight"], ["bias", "weight"])
            and weight.dim() == 2 and getattr(module, "num_experts", None) == weight.shape[0]
            and (bias is None or tuple(bias.shape) == (weight.shape[0],)))


def _bank_shapes(module: nn.Module, bank: Bank) -> dict[str, tuple[int, ...]] | None:
    """The shapes a bank's parameters must have, from its first matrix; None where that is no bank of matrices."""
    first = module.get_parameter(bank.first)
    if first.dim() != 3:
        return None
    experts, out, hidden = first.shape[0], *(first.shape[:0:-1] if bank.transposed else first.shape[1:])
    gated = bank.first == "gate_up_proj"
    inter = out // 2 if gated else out
    if gated and out % 2:
        return None
    shapes = {bank.first: tuple(first.shape), "down_proj": (experts, inter, hidden) if bank.transposed else (
        experts, hidden, inter)}
    if bank.bias:
        shapes.update({f"{bank.first}_bias": (experts, out), "down_proj_bias": (experts, hidden)})
    return shapes


def is_expert_bank(module: nn.Module) -> Bank | None:
    """A transformers experts bank (see :class:`PerturbedExperts`): how it stores its experts, or None."""
    params = {n: tuple(p.shape) for n, p in module.named_parameters(recurse=False)}
    if any(True for c in module.children() for _ in c.parameters()) or getattr(module, "has_post_expert_norm", False):
        return None
    first = "gate_up_proj" if "gate_up_proj" in params else "up_proj"
    gate = "act" if first == "up_proj" else "own" if hasattr(module, "_apply_gate") else "chunk"
    bank = Bank(first, bool(getattr(module, "is_transposed", False)), bool(getattr(module, "has_bias", False)), gate)
    if first not in params or getattr(module, "has_gate", True) != (first == "gate_up_proj") or (
            gate != "own" and not hasattr(module, "act_fn")):
        return None
    shapes = _bank_shapes(module, bank)
    if shapes != params or getattr(module, "num_experts", None) != params[first][0]:
        return None
    return bank


def _adopt_router(module: nn.Module, found, kind: Kind, options: ConversionOptions) -> nn.Module:
    swap_class(module, PerturbedRouter, "Perturbed")
    module.init_perturbation(kind, options.directions, {"weight": Geometry(*module.weight.shape)}, "linear")
    return module


def _adopt_experts(module: nn.Module, bank: Bank, kind: Kind, options: ConversionOptions) -> nn.Module:
    shapes = _bank_shapes(module, bank)
    (e, *first), down = shapes[bank.first], shapes["down_proj"][1:]
    (out, hidden), (_, inter) = (first[::-1], down[::-1]) if bank.transposed else (first, down)
    matrices = {bank.first: Geometry(e * out, e * hidden, e), "down_proj": Geometry(e * hidden, e * inter, e)}
    swap_class(module, PerturbedExperts, "Perturbed")
    module.__dict__["bank"] = bank
    module.init_perturbation(kind, options.directions, matrices, "experts", banks=frozenset(matrices),
                             transposed=frozenset(matrices) if bank.transposed else frozenset())
    return module


HF_FORMS = [Form("router", is_router, _adopt_router, "linear"),
            Form("experts", is_expert_bank, _adopt_experts, "experts")]
