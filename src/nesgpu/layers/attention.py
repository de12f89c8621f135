"""Perturbed nn.MultiheadAttention, and the transformer layers built on it.

torch's attention reads its projection weights directly (``F.multi_head_attention_forward`` takes
``out_proj.weight``), and its transformer layers have a fused fast path that reads every weight at once.
Neither can take per-member weights, so in population mode these modules run their own forward: the
q, k, v and output projections are perturbed products (any kind), their biases and ``bias_k``/``bias_v``
per-member vectors, and attention runs through ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Geometry, make_kind
from .base import PerturbedModule
from .layout import compute_dtype
from .linear import PerturbedLinear


class PerturbedMultiheadAttention(PerturbedModule, nn.MultiheadAttention):
    """nn.MultiheadAttention whose population forward perturbs the q, k, v and output projections.

    Args:
        as for :class:`torch.nn.MultiheadAttention`, plus ``kind``, its ``**options`` and ``directions``.

    Shape:
        population inputs (R * D, L, E) with ``batch_first`` (else (L, R * D, E)); row n uses direction
        n % D. Masks as for torch: ``attn_mask`` (L, S) or (R * D * heads, L, S), ``key_padding_mask``
        (R * D, S); boolean True means "not allowed".
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None, *, kind="gaussian",
                 directions=None, **options):
        nn.MultiheadAttention.__init__(self, embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn,
                                       kdim, vdim, batch_first, device, dtype)
        kind = make_kind(kind, **options)
        self.out_proj = PerturbedLinear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype, kind=kind,
                                        directions=directions)
        e = embed_dim
        matrices = ({"in_proj_weight": Geometry(3 * e, e)} if self._qkv_same_embed_dim else
                    {"q_proj_weight": Geometry(e, e), "k_proj_weight": Geometry(e, self.kdim),
                     "v_proj_weight": Geometry(e, self.vdim)})
        self.init_perturbation(kind, directions, matrices, "linear")

    def _project(self, x, weight, part, pop):
        return self.perturbed_linear(x, pop, weight, "in_proj_bias" if self.in_proj_bias is not None else None, part)

    def _in_projection(self, q, k, v, pop):
        e = self.embed_dim
        thirds = slice(0, e), slice(e, 2 * e), slice(2 * e, 3 * e)
        if not self._qkv_same_embed_dim:
            return (self._project(q, "q_proj_weight", thirds[0], pop), self._project(k, "k_proj_weight", thirds[1], pop),
                    self._project(v, "v_proj_weight", thirds[2], pop))
        # one packed (3E, E) matrix: its structured noise does not split by rows for every kind, so each
        # distinct input takes the whole product and keeps its part
        whole = None
        if q is k and k is v:
            return self._project(q, "in_proj_weight", whole, pop).chunk(3, dim=-1)
        q_ = self._project(q, "in_proj_weight", whole, pop)[..., :e]
        if k is v:
            k_, v_ = self._project(k, "in_proj_weight", whole, pop)[..., e:].chunk(2, dim=-1)
        else:
            k_ = self._project(k, "in_proj_weight", whole, pop)[..., e:2 * e]
            v_ = self._project(v, "in_proj_weight", whole, pop)[..., 2 * e:]
        return q_, k_, v_

    def population_forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                           average_attn_weights=True, is_causal=False):
        if query.dim() != 3:
            raise ValueError(f"{type(self).__name__}: a population call needs batched inputs of 3 dimensions; "
                             f"got query of shape {tuple(query.shape)}")
        if not self.batch_first:  # keep "the same tensor" visible: self-attention projects once
            same_qk, same_kv = query is key, key is value
            query = query.transpose(0, 1)
            key = query if same_qk else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        n, length, e = query.shape
        pop = self.population_of(n, compute_dtype(query), query.device)
        q, k, v = self._in_projection(query, key, value, pop)
        if key.shape[:2] != (n, value.shape[1]) or value.shape[0] != n:
            raise ValueError(f"{type(self).__name__}: query, key and value need the same rows and key / value the "
                             f"same length; got query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                             f"{tuple(value.shape)} (batch-first)")
        source = key.shape[1]
        if is_causal and attn_mask is None and (key_padding_mask is not None or need_weights or self.bias_k is not None
                                                or self.add_zero_attn):
            attn_mask, is_causal = _causal(length, source, query.device), False  # sdpa's flag cannot combine
        mask = _additive_mask(attn_mask, key_padding_mask, n, self.num_heads, length, source, q.dtype)
        extra = []
        if self.bias_k is not None:  # one more key / value per member
            extra.append(tuple(self.member_values(name, pop, t.dtype).expand(pop.repeats, pop.directions, 1, 1, e)
                               .reshape(n, 1, e) for name, t in (("bias_k", k), ("bias_v", v))))
        if self.add_zero_attn:
            extra.append((k.new_zeros(n, 1, e), v.new_zeros(n, 1, e)))
        for k_extra, v_extra in extra:
            k, v = torch.cat([k, k_extra], 1), torch.cat([v, v_extra], 1)
            if mask is not None:
                mask = F.pad(mask, (0, 1))
        heads = lambda t: t.reshape(n, t.shape[1], self.num_heads, -1).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores + mask
            weights = F.dropout(scores.softmax(-1), dropout, training=dropout > 0)
            out = weights @ v
            weights = weights.mean(1) if average_attn_weights else weights
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                 is_causal=is_causal and mask is None)
        out = self.out_proj(out.transpose(1, 2).reshape(n, length, e))
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


@contextmanager
def batch_first_as(attention: nn.MultiheadAttention, value: bool):
    """Within this block, ``attention`` treats its inputs as batch-first or not (the transformer layers run
    their population path batch-first)."""
    saved = attention.batch_first
    attention.batch_first = value
    try:
        yield
    finally:
        attention.batch_first = saved


def _causal(length: int, source: int, device) -> torch.Tensor:
    return torch.ones(length, source, dtype=torch.bool, device=device).triu(1)


def _additive_mask(attn_mask, key_padding_mask, n, heads, length, source, dtype):
    """torch's masks (bool True = not allowed, or float added) as one float mask (n or 1, heads or 1, L, S)."""
    mask = None
    if attn_mask is not None and tuple(attn_mask.shape) not in ((length, source), (n * heads, length, source)):
        raise ValueError(f"attn_mask must have shape ({length}, {source}) or ({n * heads}, {length}, {source}) "
                         f"(rows x heads first); got {tuple(attn_mask.shape)}")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (n, source):
        raise ValueError(f"key_padding_mask must have shape ({n}, {source}) (rows, source length); got "
                         f"{tuple(key_padding_mask.shape)}")
    if attn_mask is not None:
        m = _additive(attn_mask, dtype)
        mask = m.view(n, heads, length, source) if m.dim() == 3 else m.view(1, 1, length, source)
    if key_padding_mask is not None:
        kp = _additive(key_padding_mask, dtype).view(n, 1, 1, source)
        mask = kp if mask is None else mask + kp
    return None if mask is None else mask.to(dtype)


def _additive(mask: torch.Tensor, dtype) -> torch.Tensor:
    """A float mask as it is; a bool one (True: not allowed) as 0 and -inf in ``dtype``."""
    if mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))


class PerturbedTransformerEncoderLayer(nn.TransformerEncoderLayer):
    """nn.TransformerEncoderLayer whose population forward takes the plain (unfused) path, batch-first
    inside, so that its perturbed attention, linear and norm layers all see the population rows first."""

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        if not _perturbing(self):
            return super().forward(src, src_mask, src_key_padding_mask, is_causal)
        batch_first = self.self_attn.batch_first
        x = src if batch_first else src.transpose(0, 1)
        with batch_first_as(self.self_attn, True):
            if self.norm_first:
                x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal=is_causal)
                x = x + self._ff_block(self.norm2(x))
            else:
                x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal=is_causal))
                x = self.norm2(x + self._ff_block(x))
        return x if batch_first else x.transpose(0, 1)


class PerturbedTransformerDecoderLayer(nn.TransformerDecoderLayer):
    """nn.TransformerDecoderLayer with the same population path as the encoder layer."""

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        if not _perturbing(self):
            return super().forward(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                                   memory_key_padding_mask, tgt_is_causal, memory_is_causal)
        batch_first = self.self_attn.batch_first
        x, mem = (tgt, memory) if batch_first else (tgt.transpose(0, 1), memory.transpose(0, 1))
        with batch_first_as(self.self_attn, True), batch_first_as(self.multihead_attn, True):
            if self.norm_first:
                x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
                x = x + self._mha_block(self.norm2(x), mem, memory_mask, memory_key_padding_mask, memory_is_causal)
                x = x + self._ff_block(self.norm3(x))
            else:
                x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
                x = self.norm2(x + self._mha_block(x, mem, memory_mask, memory_key_padding_mask, memory_is_causal))
                x = self.norm3(x + self._ff_block(x))
        return x if batch_first else x.transpose(0, 1)


def _perturbing(layer: nn.Module) -> bool:
    """Whether a population call is running through ``layer`` (one of its perturbed modules is perturbing)."""
    return any(isinstance(m, PerturbedModule) and m.is_perturbing for m in layer.modules())
