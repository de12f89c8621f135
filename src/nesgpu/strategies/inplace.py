"""Plain SGD on the ES estimate, written into the weights in place (seed replay, as MeZO and "Evolution Strategies
at Scale" step): ``theta -= lr * g`` with ``g = 1/(D sigma) sum_d w_d z_d``, no ``.grad``, no optimizer state, and
for half-precision weights no float32 master (stochastic rounding instead). The population computes the step
(:meth:`nesgpu.Population.apply`); this optimizer holds its step size, where lr schedules set it.

Memory: the weights in their own dtype, the noise of the step's directions and a workspace of a few slices of a
weight (:data:`nesgpu.layers.estimate.SLICE`); Adam over ``.grad`` holds 8 bytes of moments per parameter plus a
float32 ``.grad`` (and a float32 master of a half-precision weight, 4 bytes more).
"""

from __future__ import annotations

import math

import torch

UPDATES = ("sgd", "strategy")
"""A run's ``update``: :class:`InPlaceSGD`, or the strategy's own over ``.grad``."""

INPLACE_SHIFT = 3.0
"""``lr = sigma^2 sqrt(D) / 3`` (``--lr auto``): with centred-rank weights (root mean square about 0.29) an entry of
g is about 0.29 / (sqrt(D) sigma), so a step moves each weight about sigma / 10, the distance Adam's rule
(lr = sigma / 10) moves it."""


class InPlaceSGD(torch.optim.Optimizer):
    """The step size of an update that :meth:`nesgpu.Population.apply` writes into ``params`` in place; its
    ``step()`` does nothing but refuse a ``.grad`` (an update that went the other way would be lost).

    Args:
        params: the perturbed parameters (the model's own weights: no masters).
        lr: the step size, > 0.
    """

    def __init__(self, params, lr: float):
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 or not math.isfinite(lr):
            raise ValueError(f"lr must be a finite number > 0; got {lr!r}")
        super().__init__(params, {"lr": float(lr)})

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise TypeError("InPlaceSGD.step takes no closure: the population writes the update in place")
        for group in self.param_groups:
            if any(p.grad is not None for p in group["params"]):
                raise RuntimeError("a parameter of InPlaceSGD has a .grad: its update is written in place by "
                                   "Population.apply, and a .grad would never be applied; use an optimizer over "
                                   ".grad (e.g. torch.optim.Adam) for Population.update")

    @staticmethod
    def lr_for_sigma(sigma: float, directions: int) -> float:
        """``--lr auto``'s step size for ``sigma`` and ``directions`` (see :data:`INPLACE_SHIFT`)."""
        return sigma * sigma * math.sqrt(directions) / INPLACE_SHIFT


__all__ = ["UPDATES", "InPlaceSGD"]
