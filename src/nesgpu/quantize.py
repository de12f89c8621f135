"""Low-bit weight quantisers: plain functions from float weights to the low-bit weights a layer computes with.

A low-bit layer keeps float *latent* weights (what ES perturbs and the optimizer steps) and multiplies with
their quantisation. Each output channel (the first dimension of a weight, or of each stacked weight) has its
own scale:

- ``bits=1`` (binary, as XNOR-Net): ``alpha_o * sign(w)``, ``alpha_o = mean |w_o|`` over the channel; the sign
  is w's sign bit (+1 for +0.0). The result has two values per channel, +alpha_o and -alpha_o.
- ``bits=8`` (symmetric int8): ``s_o * clamp(round(w / s_o), -127, 127)``, ``s_o = max |w_o| / 127`` (1 for
  an all-zero channel). The result has at most 255 values per channel.

:func:`quantize` returns the dequantised float weights (what the product sees); :func:`codes` the integer
codes and scales, e.g. for an int8 GEMM or for export.
"""

from __future__ import annotations

import math

import torch

BITS = (1, 8)
"""The supported bit widths."""

INT8_MAX = 127


def check_bits(bits) -> int:
    """``bits`` if it is a supported width, else a ValueError / TypeError naming the supported ones."""
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits must be an int, one of {list(BITS)}; got {type(bits).__name__} {bits!r}")
    if bits not in BITS:
        raise ValueError(f"bits must be one of {list(BITS)} (binary or int8 weights); got {bits}")
    return bits


def scales(w: torch.Tensor, bits: int, channel_numel_dims: int) -> torch.Tensor:
    """Each output channel's scale (see :func:`codes`): mean |w| for binary, max |w| / 127 for int8 (1 for an
    all-zero channel), with ``channel_numel_dims`` trailing ones so that it broadcasts against ``w``."""
    check_bits(bits)
    dims = tuple(range(w.dim() - channel_numel_dims, w.dim()))
    if bits == 1:
        return torch.linalg.vector_norm(w, 1, dims, keepdim=True).div_(math.prod(w.shape[d] for d in dims))
    scale = torch.maximum(w.amax(dims, keepdim=True), w.amin(dims, keepdim=True).neg_()).div_(INT8_MAX)
    return scale.masked_fill_(scale == 0, 1.0)


def codes(w: torch.Tensor, bits: int, channel_numel_dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer codes (int8: +-1 for binary, -127..127 for int8) and per-channel scales of ``w``.

    Args:
        w: weights; its last ``channel_numel_dims`` dimensions hold one output channel's values (1 for a
            Linear weight (out, in), 1 + the kernel's dimensions for a convolution), any leading dimensions
            are channels or stacked weights.
        bits: 1 or 8.

    Returns:
        (codes, scales): codes in ``w``'s shape, dtype int8; scales of shape ``w.shape[:-channel_numel_dims]``
        followed by ``channel_numel_dims`` ones (they broadcast against the codes), in ``w``'s dtype.
    """
    scale = scales(w, bits, channel_numel_dims)
    if bits == 1:
        return torch.signbit(w).to(torch.int8).mul_(-2).add_(1), scale  # +1, or -1 where the sign bit is set
    return (w / scale).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def quantize(w: torch.Tensor, bits: int, channel_numel_dims: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The low-bit weights of ``w`` in ``w``'s dtype: codes times their channel's scale (see :func:`codes`).
    ``out`` (which may be ``w`` itself) receives the result without a new allocation."""
    scale = scales(w, bits, channel_numel_dims)
    if bits == 1:  # the scale with w's sign bit: one pass, no codes
        return torch.copysign(scale, w, out=out)
    out = torch.div(w, scale) if out is None else torch.div(w, scale, out=out)
    return out.round_().clamp_(-INT8_MAX, INT8_MAX).mul_(scale)


def int8_linear(x_codes: torch.Tensor, x_scales: torch.Tensor, wt_codes: torch.Tensor, w_scales: torch.Tensor,
                bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``(x_scales * x_codes) @ (w_scales * wt_codes^T)^T + bias`` from int8 codes, in ``dtype``.

    The integer product runs as an int8 GEMM with int32 accumulation (``torch._int_mm``) where the device has
    one for these shapes (the CPU; CUDA for more than 16 rows and sizes that are multiples of 8), else as a
    float product of the codes, outside any autocast (exact in float64; in float32 while in_features * 127^2
    < 2^24). The scaling and the bias are applied in float32 (float64 for float64).

    Args:
        x_codes: (..., in) int8, with x_scales (..., 1): the activations, one scale per row.
        wt_codes: (in, out) int8, contiguous: the weight's codes transposed, as the GEMM reads them (cuBLAS
            needs this layout); w_scales (out, 1) or (out,): one scale per output channel.
    """
    flat = x_codes.reshape(-1, x_codes.shape[-1])
    acc = None
    fits = flat.device.type == "cpu" or (flat.device.type == "cuda" and flat.shape[0] > 16
                                          and flat.shape[1] % 8 == 0 and wt_codes.shape[1] % 8 == 0)
    if fits and dtype != torch.float64 and hasattr(torch, "_int_mm"):
        try:
            acc = torch._int_mm(flat, wt_codes)
        except RuntimeError:  # an older build or an unsupported shape: the float product below
            acc = None
    work = torch.float64 if dtype == torch.float64 else torch.float32
    with torch.autocast(flat.device.type, enabled=False):  # fp16 would overflow on the integer sums
        acc = flat.to(work) @ wt_codes.to(work) if acc is None else acc.to(work)
    y = acc.mul_(x_scales.reshape(-1, 1).to(work)).mul_(w_scales.reshape(1, -1).to(work))
    if bias is not None:
        y.add_(bias.to(work))
    return y.to(dtype).view(*x_codes.shape[:-1], wt_codes.shape[1])
