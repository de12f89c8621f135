"""CartPole-v1 (Barto, Sutton & Anderson 1983), as gymnasium implements it (Euler integration)."""

from __future__ import annotations

import math

import torch

from .base import TorchEnv


class CartPole(TorchEnv):
    obs_dim, state_dim, discrete, num_actions, max_steps, gym_id = 4, 4, True, 2, 500, "CartPole-v1"
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    theta_threshold = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def initial_states(self, count, generator):
        return self.uniform(count, [-0.05] * 4, [0.05] * 4, generator)

    def observe(self):
        return self.state.float()

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(action.view(-1) == 1, self.force_mag, -self.force_mag).to(torch.float64)
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        temp = (force + self.polemass_length * theta_dot.square() * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta.square() / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * xacc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc
        self.state = torch.stack([x, x_dot, theta, theta_dot], 1)
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold)
        reward = torch.ones_like(x)
        return self.observe(), reward, terminated
