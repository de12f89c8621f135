"""Which perturbed module replaces which torch module, and with which constructor arguments; each conversion
is a form (:data:`TORCH_FORMS`) that ``convert`` asks in the same ordered list as transformers' types and yours
(:func:`nesgpu.layers.form_table.forms`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from .attention import PerturbedMultiheadAttention, PerturbedTransformerDecoderLayer, PerturbedTransformerEncoderLayer
from .base import PerturbedModule
from .conv import PerturbedConv1d, PerturbedConv2d, PerturbedConv3d
from .embedding import PerturbedEmbedding
from .form import ConversionOptions, Form
from .linear import PerturbedLinear
from .lowbit import LowBitConv1d, LowBitConv2d, LowBitConv3d, LowBitLinear
from .norm import (
                   PerturbedBatchNorm1d,
                   PerturbedBatchNorm2d,
                   PerturbedBatchNorm3d,
                   PerturbedGroupNorm,
                   PerturbedLayerNorm,
                   PerturbedRMSNorm,
)
from .recurrent import PerturbedGRU, PerturbedLSTM, PerturbedRNN


def _conv(m):
    return dict(in_channels=m.in_channels, out_channels=m.out_channels, kernel_size=m.kernel_size, stride=m.stride,
                padding=m.padding, dilation=m.dilation, groups=m.groups, bias=m.bias is not None,
                padding_mode=m.padding_mode)


def _batch_norm(m):
    return dict(num_features=m.num_features, eps=m.eps, momentum=m.momentum, affine=m.affine,
                track_running_stats=m.track_running_stats)


def _rnn(m):
    args = dict(input_size=m.input_size, hidden_size=m.hidden_size, num_layers=m.num_layers, bias=m.bias,
                batch_first=m.batch_first, dropout=m.dropout, bidirectional=m.bidirectional)
    if isinstance(m, nn.LSTM):
        args["proj_size"] = m.proj_size
    if isinstance(m, nn.RNN):
        args["nonlinearity"] = m.nonlinearity
    return args


class Conversion:
    """A torch module type, its perturbed class, its constructor arguments, the product its matrices need
    from a kind (None: only elementwise noise, which every kind provides) and which of its instances the
    perturbed class covers (``fits``; any other takes the exact fallback)."""

    def __init__(self, source: type[nn.Module], target: type[nn.Module], args: Callable[[nn.Module], dict],
                 product: str | None, fits: Callable[[nn.Module], bool] = lambda m: True):
        self.source, self.target, self.args, self.product, self.fits = source, target, args, product, fits


# Order matters: the first match wins (subclasses before their parents).
CONVERSIONS: list[Conversion] = [
    Conversion(nn.Linear, PerturbedLinear, lambda m: dict(in_features=m.in_features, out_features=m.out_features,
                                                          bias=m.bias is not None), "linear"),
    Conversion(nn.Conv1d, PerturbedConv1d, _conv, "conv"),
    Conversion(nn.Conv2d, PerturbedConv2d, _conv, "conv"),
    Conversion(nn.Conv3d, PerturbedConv3d, _conv, "conv"),
    Conversion(nn.Embedding, PerturbedEmbedding, lambda m: dict(
        num_embeddings=m.num_embeddings, embedding_dim=m.embedding_dim, padding_idx=m.padding_idx,
        max_norm=m.max_norm, norm_type=m.norm_type, scale_grad_by_freq=m.scale_grad_by_freq, sparse=m.sparse),
        "embedding"),
    Conversion(nn.LayerNorm, PerturbedLayerNorm, lambda m: dict(
        normalized_shape=m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
        bias=m.bias is not None), None),
    Conversion(nn.RMSNorm, PerturbedRMSNorm, lambda m: dict(normalized_shape=m.normalized_shape, eps=m.eps,
                                                            elementwise_affine=m.elementwise_affine), None),
    Conversion(nn.GroupNorm, PerturbedGroupNorm, lambda m: dict(num_groups=m.num_groups, num_channels=m.num_channels,
                                                                eps=m.eps, affine=m.affine), None),
    Conversion(nn.BatchNorm1d, PerturbedBatchNorm1d, _batch_norm, None),
    Conversion(nn.BatchNorm2d, PerturbedBatchNorm2d, _batch_norm, None),
    Conversion(nn.BatchNorm3d, PerturbedBatchNorm3d, _batch_norm, None),
    Conversion(nn.MultiheadAttention, PerturbedMultiheadAttention, lambda m: dict(
        embed_dim=m.embed_dim, num_heads=m.num_heads, dropout=m.dropout, bias=m.in_proj_bias is not None,
        add_bias_kv=m.bias_k is not None, add_zero_attn=m.add_zero_attn, kdim=m.kdim, vdim=m.vdim,
        batch_first=m.batch_first), "linear"),
    Conversion(nn.LSTM, PerturbedLSTM, _rnn, "linear", fits=lambda m: m.proj_size == 0),
    Conversion(nn.GRU, PerturbedGRU, _rnn, "linear"),
    Conversion(nn.RNN, PerturbedRNN, _rnn, "linear"),
]

# Modules whose own forward bypasses their children's forward in a fused fast path: in population mode
# they run the plain path (the class is swapped; they hold no parameters of their own).
PATH_SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.TransformerEncoderLayer: PerturbedTransformerEncoderLayer,
    nn.TransformerDecoderLayer: PerturbedTransformerDecoderLayer,
}


# The low-bit version of a conversion's target (convert(..., bits=...)): same constructor arguments.
LOW_BIT_SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: LowBitLinear, nn.Conv1d: LowBitConv1d, nn.Conv2d: LowBitConv2d, nn.Conv3d: LowBitConv3d,
}


def conversion_for(module: nn.Module) -> Conversion | None:
    for c in CONVERSIONS:
        if isinstance(module, c.source):
            return c
    return None


def _torch_form(c: Conversion) -> Form:
    """Conversion ``c`` as a form: it detects the modules whose first matching conversion it is (their own
    forward, options the perturbed class covers) and rebuilds them, as their low-bit version with ``bits``
    (:data:`LOW_BIT_SWAPS`); asked for every module with something to perturb."""
    low_bit = LOW_BIT_SWAPS.get(c.source)
    takes = frozenset() if low_bit is None else frozenset({"bits", "act_bits"} if low_bit is LowBitLinear
                                                          else {"bits"})
    return Form(c.source.__name__, partial(_is_converted_by, c), partial(_rebuild_as, c), c.product, takes=takes,
                always=True)


def _is_converted_by(conversion: Conversion, module: nn.Module) -> bool:
    return (conversion_for(module) is conversion and type(module).forward is conversion.source.forward
            and conversion.fits(module))


def _rebuild_as(conversion: Conversion, module: nn.Module, found, kind, options: ConversionOptions) -> nn.Module:
    """``module`` rebuilt as the conversion's target (its low-bit version with ``options.bits``), weights kept."""
    extra = {} if conversion.product is None else {"kind": kind}
    target = conversion.target
    if options.bits is not None and conversion.product is not None:
        target, extra = LOW_BIT_SWAPS[conversion.source], {**extra, "bits": options.bits, "noise_on": options.noise_on}
        if options.act_bits is not None:
            extra["act_bits"] = options.act_bits
    return rebuild(target, module, {**conversion.args(module), **extra}, options.directions)


TORCH_FORMS: tuple[Form, ...] = tuple(_torch_form(c) for c in CONVERSIONS)
"""The conversions as forms, in :data:`CONVERSIONS`' order (built once: ``convert`` asks them for every module)."""


def rebuilt_as(cls: type[nn.Module], module: nn.Module, **args) -> nn.Module:
    """``cls(**args)`` holding ``module``'s state, on its device and in its dtype, with its very Parameter
    objects (an optimizer built on ``module`` still holds what trains; ties stay ties). Built on "meta", so
    that no initialisation runs (and no global RNG is consumed), then filled in."""
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), None)
    device = tensors[0].device if tensors else torch.device("cpu")
    layer = cls(**args, device="meta", dtype=dtype).to_empty(device=device)
    layer.load_state_dict(module.state_dict())
    own = dict(layer.named_parameters())
    for name, param in module.named_parameters():
        if name in own and own[name].shape == param.shape and own[name].dtype == param.dtype:
            owner, _, leaf = name.rpartition(".")
            layer.get_submodule(owner).register_parameter(leaf, param)
    return layer


def rebuild(cls: type[nn.Module], module: nn.Module, args: dict, directions: int | None) -> nn.Module:
    """:func:`rebuilt_as` a perturbed class, its parameters as trainable as ``module``'s (frozen ones get no
    noise), in ``module``'s training mode."""
    layer = rebuilt_as(cls, module, **args, directions=directions)
    trainable = {n: p.requires_grad for n, p in module.named_parameters()}
    for n, p in layer.named_parameters():
        p.requires_grad_(trainable.get(n, True))
    for m in layer.modules():
        if isinstance(m, PerturbedModule):
            m.declare_parameters()  # frozen parameters (requires_grad=False) get no noise
    layer.train(module.training)
    return layer
