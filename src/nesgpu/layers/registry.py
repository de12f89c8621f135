"""Which perturbed module replaces which torch module, and with which constructor arguments."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from . import (
    LowBitConv1d,
    LowBitConv2d,
    LowBitConv3d,
    LowBitLinear,
    PerturbedBatchNorm1d,
    PerturbedBatchNorm2d,
    PerturbedBatchNorm3d,
    PerturbedConv1d,
    PerturbedConv2d,
    PerturbedConv3d,
    PerturbedEmbedding,
    PerturbedGroupNorm,
    PerturbedGRU,
    PerturbedLayerNorm,
    PerturbedLinear,
    PerturbedLSTM,
    PerturbedMultiheadAttention,
    PerturbedRMSNorm,
    PerturbedRNN,
    PerturbedTransformerDecoderLayer,
    PerturbedTransformerEncoderLayer,
)


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
