"""Pendulum-v1: swing up and balance with a bounded torque, as gymnasium implements it."""

from __future__ import annotations

import math

import torch

from .base import TorchEnv


def angle_normalize(x: torch.Tensor) -> torch.Tensor:
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


class Pendulum(TorchEnv):
    obs_dim, state_dim, discrete, action_dim, action_high, max_steps, gym_id = 3, 2, False, 1, 2.0, 200, "Pendulum-v1"
    max_speed, dt, g, m, l = 8.0, 0.05, 10.0, 1.0, 1.0

    def initial_states(self, count, generator):
        return self.uniform(count, [-math.pi, -1.0], [math.pi, 1.0], generator)

    def observe(self):
        th, thdot = self.state.unbind(1)
        return torch.stack([torch.cos(th), torch.sin(th), thdot], 1).float()

    def step(self, action):
        th, thdot = self.state.unbind(1)
        # gymnasium keeps the float32 action's terms in float32 (NumPy's promotion rules); so do we
        u = action.reshape(-1).to(torch.float32).clamp(-self.action_high, self.action_high)
        costs = angle_normalize(th).square() + 0.1 * thdot.square() + (0.001 * u.square()).double()
        push = (3.0 / (self.m * self.l**2) * u).double()
        newthdot = thdot + (3 * self.g / (2 * self.l) * torch.sin(th) + push) * self.dt
        newthdot = newthdot.clamp(-self.max_speed, self.max_speed)
        self.state = torch.stack([th + newthdot * self.dt, newthdot], 1)
        return self.observe(), -costs, torch.zeros_like(costs, dtype=torch.bool)
