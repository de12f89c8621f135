"""Stochastic rounding: a float32 value into bfloat16 or float16 without bias, so that a half-precision weight takes
an update far below its resolution (no float32 master copy).

A value x between two neighbours lo < x < hi of the target dtype becomes hi with probability (x - lo) / (hi - lo),
else lo, so E[round(x)] = x. The draw comes from an explicit generator that the caller seeds by (seed, step,
parameter): the same run rounds the same way, whoever evaluates which directions.
"""

from __future__ import annotations

import torch

from .noise import derive_seed

ROUNDING_KEY = 0x5EED_0F_50
"""Mixed into every rounding generator's seed, so that its stream is not any noise stream's."""


def stochastic_round_(value: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """``value`` (float32, overwritten: it serves as the workspace) in ``dtype``, rounded up or down at random in
    proportion to its distance from each neighbour (unbiased). Exact values and infinities stay, NaN stays NaN.

    bfloat16 is float32's upper half: 16 random bits (:func:`random_halves`) added to the lower half carry into the
    upper one with probability (lower half) / 2^16, and the lower half is then cut off (an infinity's lower half is
    zero, so it stays; a NaN is put back, whatever its bits).
    float16 takes its two neighbours."""
    if value.dtype != torch.float32:
        raise TypeError(f"value must be float32; got {value.dtype}")
    if dtype == torch.bfloat16:
        nan = value.isnan()  # a NaN's bits may carry into another number's (CUDA's 0x7FFFFFFF into -0.0)
        bits = value.view(torch.int32)  # sign and magnitude: a carry moves away from zero, a cut toward it
        bits.add_(random_halves(value.numel(), generator, value.device).view(value.shape))
        out = bits.bitwise_and_(-65536).view(torch.float32).to(dtype)  # exact: the lower half is zero
        return out.masked_fill_(nan, float("nan"))
    near = value.to(dtype)
    near32 = near.float()
    away = torch.where(near32 > value, float("-inf"), float("inf")).to(dtype)  # toward value's other neighbour
    other = torch.nextafter(near, away)
    chance = (value - near32).div_(other.float() - near32)  # in [0, 1/2]; NaN where value or near is not finite
    draw = torch.rand(value.shape, generator=generator, device=value.device, dtype=torch.float32)
    return torch.where(draw < chance, other, near)


SMALL = 1 << 16
"""Below this many values :func:`random_halves` draws one per value, in one call."""


def random_halves(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``n`` uniform 16-bit values (int32, in [0, 2^16)), three from each 48-bit draw of ``generator``: a third of
    the draws of one per value (CPU generators draw one value at a time); fewer than :data:`SMALL`, one each."""
    if n < SMALL:  # one call: a small tensor's cost is the calls
        return torch.randint(0, 1 << 16, (n,), generator=generator, device=device, dtype=torch.int32)
    m = (n + 2) // 3
    draws = torch.empty(m, dtype=torch.int64, device=device).random_(0, 1 << 48, generator=generator)
    out = torch.empty(3, m, dtype=torch.int32, device=device)
    out[0] = draws & 0xFFFF
    out[1] = (draws >> 16) & 0xFFFF
    out[2] = draws >> 32
    return out.view(-1)[:n]


def rounding_generator(device: torch.device, seed: int, step: int, layer: int, slot: int) -> torch.Generator:
    """The generator that rounds parameter ``slot`` of layer ``layer`` at ``step`` of a run of ``seed``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(seed, step, layer, slot, ROUNDING_KEY))
    return generator


__all__ = ["random_halves", "rounding_generator", "stochastic_round_"]
