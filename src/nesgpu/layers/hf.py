"""Batched perturbed versions of the module types of Hugging Face ``transformers``.

nesgpu never imports ``transformers``: a module is recognised by its class (when the user's program has
imported the library) or by a check of what it computes, and converted in place by a class swap
(:func:`nesgpu.layers.swap.swap_class`), so its state_dict and plain forward stay as they were.

- **Conv1D** (GPT-2's Linear with the weight stored as (in, out)): the kind's linear product on the
  transposed geometry.
- **RMSNorm classes** of any model family (LlamaRMSNorm, Qwen3RMSNorm, attention's q_norm/k_norm, Gemma's
  ``(1 + weight)`` form, ...): recognised by name and then by a float64 probe of the module's own forward
  against ``w * x / rms(x)`` and ``(1 + w) * x / rms(x)``; a norm that matches neither takes the exact
  fallback.
- **Scaled embeddings** (Gemma's ``embedding(ids) * embed_scale``): recognised by a probe of their forward.
- **MoE routers** (a ``weight`` (E, H) used as ``F.linear(tokens, weight)``, then softmax / top-k, whatever the
  family does after): their own forward runs with the matrix replaced by a view that computes ``F.linear``
  per member (the kind's linear product over the rows' tokens) and refuses any other use.
- **MoE expert banks** (``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I) used through per-expert
  matmuls, Qwen3-MoE's and Mixtral's): every expert matrix takes the kind's noise (low-rank: rank r per
  expert). The bank sees tokens flattened as (rows * T, H); token j belongs to population row j // T.
"""

from __future__ import annotations

import copy
import sys
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Gaussian, Geometry, Kind
from .base import PerturbedModule
from .embedding import PerturbedEmbedding
from .layout import compute_dtype, member_tokens
from .linear import PerturbedLinear
from .swap import swap_class


class PerturbedConv1D(PerturbedModule):
    """transformers' Conv1D (y = x W + b, W of shape (in, out)) with the kind's noise on W.

    Shape: population input (R * D, *, in) -> (R * D, *, out); row n uses direction n % D.
    """

    ROW_WISE = True

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"{type(self).__name__}: expected input of shape (repeats * directions, ..., "
                             f"{self.weight.shape[0]}); got {tuple(x.shape)}")
        pop = self._population(x.shape[0], compute_dtype(x), x.device)
        return self._perturbed_linear(x, pop, "weight", "bias")

    __repr__ = nn.Module.__repr__  # transformers' Conv1D writes its own, which would hide the kind

    def extra_repr(self) -> str:
        return f"nf={self.weight.shape[1]}, nx={self.weight.shape[0]}, {super().extra_repr()}"


class PerturbedHFRMSNorm(PerturbedModule):
    """An RMSNorm class of ``transformers`` with a per-member weight: ``x / rms(x) * (offset + w)``,
    normalised in float32 as the library does, then cast back to the input's dtype.

    Shape: population input (R * D, *, C) -> the same shape.
    """

    ROW_WISE = True

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.rms_eps)).contiguous()  # x may be a strided view
        k = x.shape[-1]
        pop = self._population(x.shape[0], self.weight.dtype, x.device)  # members in the weight's dtype
        w = self._member_values("weight", pop, self.weight.dtype)
        w = w.view(w.shape[0], w.shape[1], 1, k)
        h4 = h.view(pop.repeats, pop.directions, -1, k)
        if self.rms_product == "input":  # Llama's: normalised, cast back to the input's dtype, then the product
            return (h4.to(x.dtype) * (w + self.rms_offset if self.rms_offset else w)).view(x.shape)
        # Gemma's product in float32; Olmo2's in the promoted dtype
        scale = w.float() + self.rms_offset if self.rms_product == "float32" else w + self.rms_offset
        return (h4 * scale).to(x.dtype).view(x.shape)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, eps={self.rms_eps}, offset={self.rms_offset}, product={self.rms_product!r}"


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


class PerturbedScaledEmbedding(PerturbedEmbedding):
    """An nn.Embedding subclass whose forward multiplies the lookup by a constant ``embed_scale`` (Gemma's
    scaled word embedding), with the kind's noise on the table."""

    def population_forward(self, index: torch.Tensor) -> torch.Tensor:
        scale = self.embed_scale
        return super().population_forward(index) * (scale.to(self.weight.dtype) if isinstance(scale, torch.Tensor)
                                                     else scale)


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


def _is_router(module: nn.Module) -> bool:
    params = dict(module.named_parameters())
    return ("router" in type(module).__name__.lower() and list(params) == ["weight"] and params["weight"].dim() == 2
            and getattr(module, "num_experts", None) == params["weight"].shape[0])


def _is_scaled_embedding(module: nn.Module) -> bool:
    """An nn.Embedding subclass computing ``F.embedding(ids, weight, padding_idx) * embed_scale`` (probed on a
    small table), the scale a number or a one-element tensor."""
    scale = getattr(module, "embed_scale", None)
    if (not isinstance(module, nn.Embedding) or type(module).forward is nn.Embedding.forward or module.max_norm
            or not (isinstance(scale, (int, float)) or isinstance(scale, torch.Tensor) and scale.numel() == 1)
            or module.weight.device.type == "meta"):
        return False
    gen = torch.Generator().manual_seed(0)
    rows = max(8, (module.padding_idx or 0) + 1)
    table = torch.randn(rows, module.embedding_dim, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, rows, (2, 5), generator=gen)
    y = _probe(module, table, ids, torch.float64)
    expected = F.embedding(ids, table, module.padding_idx) * (torch.as_tensor(scale).double())
    return isinstance(y, torch.Tensor) and y.shape == expected.shape and torch.allclose(y.double(), expected,
                                                                                       rtol=1e-6, atol=1e-9)


def _is_linear_subclass(module: nn.Module) -> bool:
    """An nn.Linear subclass whose own forward computes ``F.linear(x, weight, bias)`` (Falcon's ``x @ W.T + b``),
    probed bit for bit in float64 on a small copy."""
    if not isinstance(module, nn.Linear) or type(module).forward is nn.Linear.forward or module.weight.is_meta:
        return False
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, module.in_features, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 5, module.in_features, generator=gen, dtype=torch.float64)
    probe = copy.copy(module)
    probe._parameters = {"weight": nn.Parameter(w, requires_grad=False), "bias": None if module.bias is None else
                         nn.Parameter(torch.randn(3, generator=gen, dtype=torch.float64), requires_grad=False)}
    probe._forward_hooks, probe._forward_pre_hooks = type(module._forward_hooks)(), type(module._forward_pre_hooks)()
    try:
        with torch.no_grad():
            y = probe(x)
    except Exception:  # another signature: not this form
        return False
    expected = F.linear(x, w, probe._parameters["bias"])
    return isinstance(y, torch.Tensor) and y.shape == expected.shape and torch.allclose(y, expected, rtol=1e-12,
                                                                                       atol=1e-12)


def _is_conv1d(module: nn.Module) -> bool:
    utils = sys.modules.get("transformers.pytorch_utils")  # only if the user's program imported transformers
    conv1d = getattr(utils, "Conv1D", None)
    return conv1d is not None and isinstance(module, conv1d) and type(module).forward is conv1d.forward


def _is_expert_bank(module: nn.Module) -> bool:
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


class RMSForm(NamedTuple):
    """An RMSNorm's form: ``(offset + w) * x / rms(x)``, normalised in float32, the product taken in the input's
    dtype (``"input"``: cast back first, Llama's order), in float32 (``"float32"``: Gemma's ``w.float()``) or in
    the promoted dtype of float32 and the weight's (``"promoted"``: Olmo2's), then cast to the input's dtype."""

    offset: float
    product: str


def rms_norm_form(module: nn.Module) -> RMSForm | None:
    """The form of ``module`` when it is an RMSNorm (checked on its own forward: the offset in float64 with
    random weights and inputs, the order of the product bit for bit in bfloat16), else None."""
    params = dict(module.named_parameters())
    if "rmsnorm" not in type(module).__name__.lower() or list(params) != ["weight"] or list(module.children()):
        return None
    weight, eps = params["weight"], getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if weight.dim() != 1 or not isinstance(eps, float) or weight.device.type == "meta":
        return None
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(weight.numel(), generator=gen, dtype=torch.float64)
    x = 3 * torch.randn(3, 2, weight.numel(), generator=gen, dtype=torch.float64)
    y = _probe(module, w, x)
    normalised = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    for offset in (0.0, 1.0):  # the library normalises in float32: compare at its precision
        if isinstance(y, torch.Tensor) and y.shape == x.shape and torch.allclose(
                y.double(), normalised * (offset + w), rtol=1e-5, atol=1e-6):
            return RMSForm(offset, _rms_product(module, offset, eps, w, x, y))
    return None


def _rms_product(module: nn.Module, offset: float, eps: float, w: torch.Tensor, x: torch.Tensor,
                 y: torch.Tensor) -> str:
    """Where an RMSNorm takes its product, told apart bit for bit: in float64 (float32 vs the rest), then in
    bfloat16 (the input's dtype vs the promoted one)."""
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    if torch.equal(y, (h * (w.float() + offset)).to(x.dtype)):
        return "float32"
    w16, x16 = w.bfloat16(), x.bfloat16()
    h = x16.float() * torch.rsqrt(x16.float().pow(2).mean(-1, keepdim=True) + eps)
    y16 = _probe(module, w16, x16)
    return "input" if isinstance(y16, torch.Tensor) and torch.equal(y16, h.to(torch.bfloat16) * (w16 + offset)) else (
        "promoted")


def _probe(module: nn.Module, weight: torch.Tensor, x: torch.Tensor, dtype: torch.dtype | None = None):
    """``module``'s own forward on ``x`` with ``weight`` in place of its own, run on a shallow copy (its
    parameters, buffers and children dicts its own; never a copy of a large table), or None if it fails."""
    dtype = dtype or x.dtype
    probe = copy.copy(module)
    probe._parameters = {"weight": nn.Parameter(weight, requires_grad=False)}
    probe._buffers = {k: None if b is None else b.detach().to("cpu", dtype if b.is_floating_point() else b.dtype)
                      for k, b in module._buffers.items()}
    probe._modules = {}
    probe._forward_hooks, probe._forward_pre_hooks = type(module._forward_hooks)(), type(module._forward_pre_hooks)()
    for key, value in module.__dict__.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():  # e.g. embed_scale as a plain tensor
            probe.__dict__[key] = value.detach().to("cpu", dtype)
    try:
        with torch.no_grad():
            return probe(x)
    except Exception:  # another signature (a gated norm): not this form
        return None


class Recognised(NamedTuple):
    """A transformers module type nesgpu has a batched version of: its form, the product it needs from a
    kind (None: elementwise noise only) and, for an RMSNorm, its form."""

    form: str
    product: str | None
    rms: RMSForm | None = None


def recognise(module: nn.Module) -> Recognised | None:
    """What :func:`adopt` would make of ``module`` (each check, and each probe, runs once), or None."""
    if _is_conv1d(module):
        return Recognised("conv1d", "linear")
    if _is_linear_subclass(module):
        return Recognised("linear", "linear")
    if _is_scaled_embedding(module):
        return Recognised("scaled_embedding", "embedding")
    if _is_router(module):
        return Recognised("router", "linear")
    if _is_expert_bank(module):
        return Recognised("experts", "experts")
    rms = rms_norm_form(module)
    return None if rms is None else Recognised("rms_norm", None, rms)


def adopt(module: nn.Module, found: Recognised, kind: Kind, directions: int | None) -> nn.Module:
    """``module`` converted in place as :func:`recognise` found it, its matrices with ``kind`` (which has
    ``found.product``)."""
    if found.form == "conv1d":
        nx, nf = module.weight.shape
        swap_class(module, PerturbedConv1D, "Perturbed")
        module._init_perturbation(kind, directions, {"weight": Geometry(nf, nx)}, "linear",
                                  transposed=frozenset({"weight"}))
    elif found.form == "linear":  # its own class kept: the plain path is its own forward
        swap_class(module, PerturbedLinear, "Perturbed")
        module._init_perturbation(kind, directions, {"weight": Geometry(module.out_features, module.in_features)},
                                  "linear")
    elif found.form == "scaled_embedding":
        swap_class(module, PerturbedScaledEmbedding, "Perturbed")
        module._init_perturbation(kind, directions, {"weight": Geometry(module.num_embeddings, module.embedding_dim)},
                                  "embedding")
    elif found.form == "router":
        swap_class(module, PerturbedRouter, "Perturbed")
        module._init_perturbation(kind, directions, {"weight": Geometry(*module.weight.shape)}, "linear")
    elif found.form == "experts":
        e, two_inter, hidden = module.gate_up_proj.shape
        matrices = {"gate_up_proj": Geometry(e * two_inter, e * hidden, e),
                    "down_proj": Geometry(e * hidden, e * (two_inter // 2), e)}
        swap_class(module, PerturbedExperts, "Perturbed")
        module._init_perturbation(kind, directions, matrices, "experts", banks=frozenset(matrices))
    else:
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        swap_class(module, PerturbedHFRMSNorm, "Perturbed")
        module.rms_eps, module.rms_offset, module.rms_product = float(eps), *found.rms
        module._init_perturbation(Gaussian(), directions, {}, "elementwise")
    return module
