"""MountainCarContinuous-v0 (Moore 1990), as gymnasium implements it (state stored in float32)."""

from __future__ import annotations

import torch

from .base import TorchEnv


class MountainCarContinuous(TorchEnv):
    obs_dim, state_dim, discrete, action_dim, action_high, max_steps = 2, 2, False, 1, 1.0, 999
    gym_id = "MountainCarContinuous-v0"
    min_position, max_position, max_speed, goal_position, power = -1.2, 0.6, 0.07, 0.45, 0.0015

    def initial_states(self, count, generator):
        position = self.uniform(count, [-0.6], [-0.4], generator)
        return torch.cat([position, torch.zeros_like(position)], 1).float().double()

    def observe(self):
        return self.state.float()

    def step(self, action):
        position, velocity = self.state.float().unbind(1)  # gymnasium computes in float32
        a = action.reshape(-1).to(torch.float32)
        force = a.clamp(-1.0, 1.0)
        velocity = velocity + (force * self.power - 0.0025 * torch.cos(3 * position.double()).float())
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = (position + velocity).clamp(self.min_position, self.max_position)
        velocity = torch.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        terminated = (position >= self.goal_position) & (velocity >= 0)
        reward = torch.where(terminated, 100.0, 0.0).double() - a.double().square() * 0.1
        self.state = torch.stack([position, velocity], 1).double()
        return self.observe(), reward, terminated
