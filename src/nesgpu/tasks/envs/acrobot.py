"""Acrobot-v1 (Sutton 1996; the "book" dynamics, RK4 with dt = 0.2), as gymnasium implements it."""

from __future__ import annotations

import math

import torch

from .base import TorchEnv


class Acrobot(TorchEnv):
    obs_dim, state_dim, discrete, num_actions, max_steps, gym_id = 6, 4, True, 3, 500, "Acrobot-v1"
    dt = 0.2
    m1 = m2 = l1 = 1.0
    lc1 = lc2 = 0.5
    moi = 1.0
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi

    def initial_states(self, count, generator):
        # gymnasium draws float64 then stores float32
        return self.uniform(count, [-0.1] * 4, [0.1] * 4, generator).float().double()

    def observe(self):
        s = self.state
        return torch.stack([torch.cos(s[:, 0]), torch.sin(s[:, 0]), torch.cos(s[:, 1]), torch.sin(s[:, 1]),
                            s[:, 2], s[:, 3]], 1).float()

    def _dsdt(self, s: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        m1, m2, l1, lc1, lc2, i1, i2, g = self.m1, self.m2, self.l1, self.lc1, self.lc2, self.moi, self.moi, 9.8
        theta1, theta2, dtheta1, dtheta2 = s.unbind(1)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * torch.cos(theta2)) + i1 + i2
        d2 = m2 * (lc2**2 + l1 * lc2 * torch.cos(theta2)) + i2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * dtheta2**2 * torch.sin(theta2)
                - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * torch.sin(theta2)
                + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2) + phi2)
        ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * torch.sin(theta2) - phi2) / (
            m2 * lc2**2 + i2 - d2**2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], 1)

    def step(self, action):
        torque = action.reshape(-1).to(torch.float64) - 1.0  # actions 0, 1, 2 -> torque -1, 0, +1
        s, dt = self.state, self.dt
        k1 = self._dsdt(s, torque)
        k2 = self._dsdt(s + dt / 2 * k1, torque)
        k3 = self._dsdt(s + dt / 2 * k2, torque)
        k4 = self._dsdt(s + dt * k3, torque)
        ns = s + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        wrapped = torch.remainder(ns[:, :2] + math.pi, 2 * math.pi) - math.pi
        # gymnasium's wrap leaves exactly +pi alone; remainder maps it to -pi (measure zero)
        self.state = torch.cat([wrapped, ns[:, 2:3].clamp(-self.max_vel_1, self.max_vel_1),
                                ns[:, 3:4].clamp(-self.max_vel_2, self.max_vel_2)], 1)
        terminated = -torch.cos(self.state[:, 0]) - torch.cos(self.state[:, 1] + self.state[:, 0]) > 1.0
        reward = torch.where(terminated, 0.0, -1.0).to(torch.float64)
        return self.observe(), reward, terminated
