"""ClipUp (Toklu et al. 2020, "ClipUp: A Simple and Powerful Optimizer for Distribution-based Policy
Evolution"): heavy-ball momentum on the normalised gradient, with the velocity's norm clipped."""

from __future__ import annotations

import torch


class ClipUp(torch.optim.Optimizer):
    """v <- momentum * v + lr * g / ||g||;  v <- v * min(1, max_speed / ||v||);  theta <- theta - v.

    Norms are taken over all parameters of a group together.

    Args:
        params: parameters or parameter groups.
        lr: step size (the paper's alpha).
        max_speed: velocity norm cap (default ``2 * lr``, the paper's advice).
        momentum: heavy-ball coefficient (default 0.9).
    """

    def __init__(self, params, lr: float = 0.15, max_speed: float | None = None, momentum: float = 0.9):
        if lr <= 0:
            raise ValueError(f"lr must be > 0; got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {momentum}")
        max_speed = 2 * lr if max_speed is None else max_speed
        if max_speed <= 0:
            raise ValueError(f"max_speed must be > 0; got {max_speed}")
        super().__init__(params, dict(lr=lr, max_speed=max_speed, momentum=momentum))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
            velocities = []
            for p in params:
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p)
                v = state["velocity"]
                v.mul_(group["momentum"]).add_(p.grad / grad_norm.clamp_min(1e-12), alpha=group["lr"])
                velocities.append(v)
            speed = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(v) for v in velocities]))
            clip = (group["max_speed"] / speed.clamp_min(1e-12)).clamp(max=1.0)
            for p, v in zip(params, velocities):
                v.mul_(clip)
                p.sub_(v)
        return loss
