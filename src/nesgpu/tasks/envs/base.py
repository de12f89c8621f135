"""Batched classic-control environments written in torch: every row steps at once, on the caller's device.

Each environment follows gymnasium's implementation step for step (tests compare them). The state is
kept in float64, as gymnasium computes it; observations are float32. Time limits are the rollout's job.
"""

from __future__ import annotations

import torch


class TorchEnv:
    """n independent copies of one environment.

    Class attributes describe the spaces: ``obs_dim``; ``discrete`` with ``num_actions``, or continuous with
    ``action_dim`` and ``action_high`` (symmetric bounds); ``max_steps`` (gymnasium's TimeLimit).
    """

    obs_dim: int
    state_dim: int
    discrete: bool
    num_actions: int = 0
    action_dim: int = 0
    action_high: float = 1.0
    max_steps: int
    gym_id: str

    def __init__(self, n: int, device: torch.device | str = "cpu"):
        self.n = n
        self.device = torch.device(device)
        self.state = torch.zeros(n, self.state_dim, dtype=torch.float64, device=self.device)

    def initial_states(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` start states drawn as gymnasium's reset draws them, (count, state_dim) float64."""
        raise NotImplementedError

    def reset(self, seed: int, groups: torch.Tensor, count: int) -> torch.Tensor:
        """Start every row; rows with the same group id (in [0, count)) start from the same state.
        Returns observations."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.state = self.initial_states(count, gen)[groups.to(self.device)]
        return self.observe()

    def observe(self) -> torch.Tensor:
        raise NotImplementedError

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Advance every row. Returns (observation float32, reward float64, terminated bool)."""
        raise NotImplementedError

    def uniform(self, count: int, low, high, generator: torch.Generator) -> torch.Tensor:
        """``count`` states drawn uniformly between ``low`` and ``high`` (per entry), (count, len(low)) float64,
        from ``generator`` (for :meth:`initial_states`)."""
        low = torch.as_tensor(low, dtype=torch.float64, device=self.device)
        high = torch.as_tensor(high, dtype=torch.float64, device=self.device)
        u = torch.rand(count, low.numel(), generator=generator, dtype=torch.float64, device=self.device)
        return low + (high - low) * u
