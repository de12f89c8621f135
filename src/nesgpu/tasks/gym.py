"""Any gymnasium environment (``gym:<id>``) as a batched environment, through gymnasium's vector API."""

from __future__ import annotations

import numpy as np
import torch

from ..noise import derive_seed


class GymVectorEnv:
    """n copies of a gymnasium environment in a synchronous vector env, with torch tensors in and out.

    Rows of the same group start from the same seed (so from the same state). After a row's episode
    ends, gymnasium resets it on the next step; the rollout ignores everything after the first episode.
    """

    def __init__(self, env_id: str, n: int, device: torch.device | str = "cpu"):
        try:
            import gymnasium as gym
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("gym:<id> tasks need gymnasium: pip install 'nesgpu[rl]'") from e
        self.env_id, self.n, self.device = env_id, n, torch.device(device)
        self.env = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
        space = self.env.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self._low = None if self.discrete else space.low
        self._high = None if self.discrete else space.high

    @staticmethod
    def spec(env_id: str):
        """Spaces of ``env_id`` in the form RLTask expects."""
        import gymnasium as gym
        env = gym.make(env_id)
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(f"gym:{env_id} needs a flat Box observation space; got {obs_space}")
        discrete = isinstance(act_space, gym.spaces.Discrete)
        if not discrete and not (isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1):
            raise ValueError(f"gym:{env_id} needs a Discrete or flat Box action space; got {act_space}")
        high = 1.0 if discrete else float(np.max(np.abs(np.concatenate([act_space.low, act_space.high]))))
        max_steps = env.spec.max_episode_steps or 1000
        env.close()  # reward_threshold: the return at which gymnasium calls the task solved (or None)
        return type("GymSpec", (), dict(
            obs_dim=obs_space.shape[0], discrete=discrete, num_actions=int(act_space.n) if discrete else 0,
            action_dim=0 if discrete else act_space.shape[0], action_high=high, max_steps=max_steps,
            reward_threshold=env.spec.reward_threshold))

    def reset(self, seed: int, groups: torch.Tensor, count: int) -> torch.Tensor:
        seeds = [derive_seed(seed, g) % 2**31 for g in groups.tolist()]
        obs, _ = self.env.reset(seed=seeds)
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device)

    def step(self, action: torch.Tensor):
        a = action.detach().cpu().numpy()
        a = a.astype(np.int64) if self.discrete else np.clip(a.astype(np.float32), self._low, self._high)
        obs, reward, terminated, truncated, _ = self.env.step(a)
        done = torch.as_tensor(np.logical_or(terminated, truncated), device=self.device)
        return (torch.as_tensor(obs, dtype=torch.float32, device=self.device),
                torch.as_tensor(reward, dtype=torch.float64, device=self.device), done)
