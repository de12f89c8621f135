"""transformers' MoE module types: routers (a ``weight`` (E, H) used as ``F.linear(tokens, weight)``, maybe
cast or transposed first) and expert banks (``gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I): Qwen3-MoE's,
Mixtral's). The bank sees tokens flattened as (rows * T, H); token j belongs to population row j // T."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Geometry, Kind
from .base import PerturbedModule
from .form import Form
from .layout import compute_dtype, member_tokens
from .swap import swap_class


class PerturbedExperts(PerturbedModule):
    """A bank of MoE experts, ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I), each expert
    matrix with its own noise; forward(hidden (N, H), top_k_index (N, k), top_k_weights (N, k)) as
    transformers' eager experts. Tokens are the population rows flattened: N = rows * T."""

    def population_forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
        n, tokens = hidden.shape[0], member_tokens(self.population_layout, hidden, self.label, self.layer_name)
        pop = self._population(n // tokens, compute_dtype(hidden), hidden.device)
        row = torch.arange(n, device=hidden.device) // tokens
        direction, scale = row % pop.directions, pop.scale[row // pop.directions]
        out = torch.zeros_like(hidden)
        for expert in range(self.num_experts):
            position, token = torch.where((top_k_index == expert).t())
            if token.numel() == 0:
                continue
            h = self._expert_linear("gate_up_proj", expert, hidden[token], direction[token], scale[token])
            gate, up = h.chunk(2, dim=-1)
            h = self._expert_linear("down_proj", expert, self.act_fn(gate) * up, direction[token], scale[token])
            out.index_add_(0, token, (h * top_k_weights[token, position, None]).to(out.dtype))
        return out

    def _expert_linear(self, name, expert, x, direction, scale) -> torch.Tensor:
        y = F.linear(x, self.get_parameter(name)[expert])
        noise = self._noise_of(name, y.dtype)
        if noise is not None:
            self._slot(name).kind.experts_(x.to(y.dtype), y, scale.to(y.dtype), direction, noise, expert)
        return y


_CASTS = frozenset({torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as, torch.Tensor.float, torch.Tensor.double,
                    torch.Tensor.half, torch.Tensor.bfloat16})
_TRANSPOSES = frozenset({torch.Tensor.t, torch.Tensor.transpose, torch.Tensor.T.__get__, torch.Tensor.mT.__get__})
_MATMULS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__})


class PerturbedRouter(PerturbedModule):
    """An MoE router (a ``weight`` (E, H) used as ``F.linear(tokens, weight)`` or ``tokens @ weight.t()``,
    maybe cast first: ``weight.float()``, ``.to(dtype)``, ``.type(dtype)``): its own forward, with every
    member's logits from the kind's linear product over that member's tokens. Any other use of the matrix is an error.

    Shape: tokens (rows * T, H) or (rows, ..., H), as the library's routers see them.
    """

    def population_forward(self, *args, **kwargs):
        state = self.__dict__
        inside, state["_inside"] = state["_inside"], False  # its own forward reads the matrix as a GuardedValue
        try:
            return super(PerturbedModule, self).forward(*args, **kwargs)  # the router's own forward
        finally:
            state["_inside"] = inside

    def guarded_use(self, guard, func, args, kwargs):
        if guard.owner is not self:
            return NotImplemented
        if func in _CASTS and args and args[0] is guard:
            with torch._C.DisableTorchFunctionSubclass():  # the cast's dtype, read off an empty tensor
                cast = func(torch.empty(0, dtype=guard.dtype, device=guard.device), *args[1:], **kwargs)
            return guard.cast(cast.dtype) if isinstance(cast, torch.Tensor) and cast.device == guard.device else (
                NotImplemented)
        swaps = func is not torch.Tensor.transpose or sorted(d % 2 for d in args[1:3]) == [0, 1]
        if func in _TRANSPOSES and args[0] is guard and guard.dim() == 2 and swaps:
            return guard.transpose_view()
        plain_input = len(args) >= 2 and not isinstance(args[0], type(guard))
        if func is F.linear and plain_input and args[1] is guard and not guard.transposed:
            return self.token_linear(args[0], args[2] if len(args) > 2 else kwargs.get("bias"), guard.dtype)
        if func in _MATMULS and plain_input and args[1] is guard and guard.transposed:  # tokens @ weight.t()
            return self.token_linear(args[0], None, guard.dtype)
        return NotImplemented

    def token_linear(self, x: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """``F.linear(x, weight.to(dtype), bias)`` for every member over its own tokens."""
        with self.own_call():
            n, tokens = x.shape[0], member_tokens(self.population_layout, x, self.label, self.layer_name)
            rows = n // tokens
            per_row = x if tokens == 1 else x.view(rows, tokens, x.shape[-1])
            pop = self._population(rows, compute_dtype(per_row), x.device)
            y = F.linear(per_row, self.weight.to(dtype), bias)
            y = self._perturbed_linear(per_row, pop, "weight", None, y=y)
            return y.view(*x.shape[:-1], -1)


def is_router(module: nn.Module) -> bool:
    params = dict(module.named_parameters())
    return ("router" in type(module).__name__.lower() and list(params) == ["weight"] and params["weight"].dim() == 2
            and getattr(module, "num_experts", None) == params["weight"].shape[0])


def is_expert_bank(module: nn.Module) -> bool:
    params = dict(module.named_parameters(recurse=False))
    if sorted(params) != ["down_proj", "gate_up_proj"] or any(True for c in module.children() for _ in c.parameters()):
        return False
    gate_up, down = params["gate_up_proj"], params["down_proj"]
    if gate_up.dim() != 3 or down.dim() != 3 or not hasattr(module, "act_fn"):
        return False
    experts, two_inter, hidden = gate_up.shape
    layout_ok = not getattr(module, "is_transposed", False) and not getattr(module, "has_bias", False) and (
        getattr(module, "is_concatenated", True) and getattr(module, "has_gate", True))
    return layout_ok and getattr(module, "num_experts", None) == experts and down.shape == (
        experts, hidden, two_inter // 2) and two_inter % 2 == 0


def _adopt_router(module: nn.Module, found, kind: Kind, directions: int | None) -> nn.Module:
    swap_class(module, PerturbedRouter, "Perturbed")
    module._init_perturbation(kind, directions, {"weight": Geometry(*module.weight.shape)}, "linear")
    return module


def _adopt_experts(module: nn.Module, found, kind: Kind, directions: int | None) -> nn.Module:
    e, two_inter, hidden = module.gate_up_proj.shape
    matrices = {"gate_up_proj": Geometry(e * two_inter, e * hidden, e),
                "down_proj": Geometry(e * hidden, e * (two_inter // 2), e)}
    swap_class(module, PerturbedExperts, "Perturbed")
    module._init_perturbation(kind, directions, matrices, "experts", banks=frozenset(matrices))
    return module


FORMS = [Form("router", is_router, _adopt_router, "linear"), Form("experts", is_expert_bank, _adopt_experts, "experts")]
