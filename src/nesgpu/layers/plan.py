"""The plan of a perturbed module's plain call, kept for the rest of a population call.

A decode step calls every layer once per generated token with an input of the same shape, the same noise and
the same sigma. A plan binds what a layer's population forward takes from those besides the weights (the
noise in the compute dtype, each sign's sigma, the rows' layout, the shapes its views need), once per kind of
input (:func:`call_key`), so that a call runs the layer's arithmetic and nothing else: on a small model the
checks and lookups of the general path cost more than the arithmetic. A plan computes the same values as the
general path, bit for bit; it reads the weights at every call (an in-place change is seen), and is dropped when
a population call begins or ends and when the noise is drawn again or freed.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .layout import RowLayout

MAX_PLANS = 8
"""Plans a module keeps per population call (one per kind of input: a prefill's and a decode step's, a layer called
on two shapes in turn); past it they are dropped and built again."""


class CallPlan(NamedTuple):
    """A module's population forward for inputs of one ``key``: ``run(x)``, or None where the general path runs
    (an input, a kind or a state the plan does not cover; the general path also raises where ``x`` is wrong)."""

    key: tuple
    run: Callable[[torch.Tensor], torch.Tensor] | None


def call_key(x: torch.Tensor, layout: RowLayout | None) -> tuple:
    """What a plan depends on besides the module: the input's shape, dtype, device and contiguity, autocast on
    its device, and the model's population layout (which tells a row-wise module where each row's member is)."""
    return x.shape, x.dtype, x.device, x.is_contiguous(), torch.is_autocast_enabled(x.device.type), layout


def rows_first(x: torch.Tensor, layout: RowLayout | None, directions: int, antithetic: bool) -> bool:
    """Whether a row-wise module's input has the population's rows on its first dimension (not their tokens
    flattened, nor one row every member shares), R x D of them (R even with antithetic sampling): the only
    input a plan covers (the general path raises for the others)."""
    rows = x.shape[0] if x.dim() >= 2 else 0
    if not rows or (layout is not None and rows != layout.rows) or rows % directions:
        return False
    return not (antithetic and rows // directions % 2)
