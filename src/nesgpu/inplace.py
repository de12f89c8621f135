"""Steps on the ES estimate written into the weights in place (seed replay, as MeZO and "Evolution Strategies at
Scale" step): no ``.grad``, and for half-precision weights no float32 master (stochastic rounding instead). The
population computes the estimate slice by slice (:meth:`nesgpu.Population.apply`); these optimizers hold the step
size (where lr schedules set it) and, for Adam, the moments, and turn each slice of the estimate into new weights
(:class:`nesgpu.layers.estimate.Rule`).

Memory beyond the weights: :class:`InPlaceSGD` none; :class:`InPlaceAdam` two moments in the weights' own dtype
(4 bytes a bfloat16 parameter). Adam over ``.grad`` (``--update strategy``) holds a float32 ``.grad`` and two float32
moments, 12 bytes a parameter, and a float32 master of a half-precision weight, 4 more.
"""

from __future__ import annotations

import math

import torch

from .rounding import stochastic_round_

UPDATES = ("sgd", "adam", "strategy")
"""A run's ``update``: :class:`InPlaceSGD`, :class:`InPlaceAdam`, or the strategy's own optimizer over ``.grad``."""

INPLACE_SHIFT = 1.5
"""``lr = sigma^2 sqrt(D) / 1.5`` (SGD's ``--lr auto``): with centred-rank weights (root mean square about 0.29) an
entry of g is about 0.29 / (sqrt(D) sigma), so a step moves each weight about sigma / 5, twice the distance of Adam's
rule (lr = sigma / 10). Measured on the binary race model (BENCHMARKS.md, issue 56): sigma / 10 left 8 points of
accuracy in 400 steps, 4x as far forgets more and varies by seed, and 8x diverges."""


class InPlace(torch.optim.Optimizer):
    """What the in-place steps share: a checked step size and L2 coefficient, ``begin()`` once per update, and a
    ``step()`` that does nothing but refuse a ``.grad`` (an update that went the other way would be lost)."""

    def __init__(self, params, defaults: dict):
        lr, l2 = defaults["lr"], defaults.get("l2", 0.0)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 or not math.isfinite(lr):
            raise ValueError(f"lr must be a finite number > 0; got {lr!r}")
        if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not 0 <= l2 < math.inf:
            raise ValueError(f"l2 must be a finite number >= 0; got {l2!r}")
        super().__init__(params, {**defaults, "lr": float(lr), "l2": float(l2)})

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, keeping this optimizer's L2 coefficient: the run's, not the checkpoint's (an optimizer over
        .grad reads the strategy's at every step too)."""
        l2 = [group["l2"] for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, value in zip(self.param_groups, l2):
            group["l2"] = value

    def begin(self) -> None:
        """An update starts (Adam counts its steps)."""

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise TypeError(f"{type(self).__name__}.step takes no closure: the population writes the update in place")
        for group in self.param_groups:
            if any(p.grad is not None for p in group["params"]):
                raise RuntimeError(f"a parameter of {type(self).__name__} has a .grad: its update is written in place "
                                   f"by Population.apply, and a .grad would never be applied; use an optimizer over "
                                   f".grad (e.g. torch.optim.Adam) for Population.update")


class InPlaceSGD(InPlace):
    """``theta -= lr * (g + l2 * theta)``: plain SGD, no state.

    Args:
        params: the perturbed parameters (the model's own weights: no masters).
        lr: the step size, > 0.
        l2: an L2 coefficient added to the estimate (OpenAI-ES's weight decay).
    """

    def __init__(self, params, lr: float, l2: float = 0.0):
        super().__init__(params, {"lr": lr, "l2": l2})

    @property
    def coef_factor(self) -> float:
        return -self.param_groups[0]["lr"]  # the estimate arrives as the step itself: -lr g

    def step_(self, target, g, param, view, generator):
        group = self.param_groups[0]
        keep = 1 - group["lr"] * group["l2"]
        if generator is None:  # full precision: in place
            return (target.mul_(keep) if keep != 1 else target).add_(g)
        return g.add_(target, alpha=keep)  # float32 += the half-precision slice: no copy of the slice

    @staticmethod
    def lr_for_sigma(sigma: float, directions: int) -> float:
        """``--lr auto``'s step size for ``sigma`` and ``directions`` (see :data:`INPLACE_SHIFT`)."""
        return sigma * sigma * math.sqrt(directions) / INPLACE_SHIFT


class InPlaceAdam(InPlace):
    """Adam (torch.optim.Adam's arithmetic, ``l2`` as its weight_decay) with both moments in each weight's own dtype
    (bfloat16 for a float16 weight: the same bytes, and the range g^2 needs), a half-precision one's stochastically
    rounded by the weight's generator.

    Args:
        params: the perturbed parameters.
        lr, betas, eps: Adam's.
        l2: an L2 coefficient added to the estimate.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 l2: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "l2": l2, "step": 0})

    def begin(self) -> None:
        self.param_groups[0]["step"] += 1

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, with each moment kept in its own dtype (torch casts state to the parameter's: a float16
        weight's bfloat16 moments would overflow)."""
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, state in state_dict["state"].items():
            self.state[params[int(index)]] = {k: v.to(device=params[int(index)].device) for k, v in state.items()}

    coef_factor = 1.0  # the estimate itself

    def step_(self, target, g, param, view, generator):
        group = self.param_groups[0]
        (beta1, beta2), t = group["betas"], group["step"]
        value = target if generator is None else target.float()
        if group["l2"]:
            g = g.add_(value, alpha=group["l2"])
        state = self.state[param]
        if not state:  # float16's range (65504) is too short for g^2: bfloat16's bytes, float32's range
            dtype = torch.bfloat16 if param.dtype == torch.float16 else param.dtype
            state.update(exp_avg=torch.zeros_like(param, dtype=dtype), exp_avg_sq=torch.zeros_like(param, dtype=dtype))
        m, v = view(state["exp_avg"]), view(state["exp_avg_sq"])
        m32, v32 = (m, v) if generator is None else (m.float(), v.float())
        m32.lerp_(g, 1 - beta1)
        v32.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = v32.sqrt().div_(math.sqrt(1 - beta2 ** t))
        value.addcdiv_(m32, denom.add_(group["eps"]), value=-group["lr"] / (1 - beta1 ** t))
        if generator is not None:  # the moments' rounding, then the weight's, from the weight's generator
            m.copy_(stochastic_round_(m32, m.dtype, generator))
            v.copy_(stochastic_round_(v32, v.dtype, generator))
        return value

    @staticmethod
    def lr_for_sigma(sigma: float, directions: int) -> float:
        """``--lr auto``: OpenAI-ES's Adam rule, sigma / 10."""
        return sigma / 10


IN_PLACE = {"sgd": InPlaceSGD, "adam": InPlaceAdam}
"""The in-place steps by ``update`` name."""

__all__ = ["IN_PLACE", "UPDATES", "InPlace", "InPlaceAdam", "InPlaceSGD"]
