"""Each torch environment matches gymnasium's own implementation, step for step."""

import numpy as np
import pytest
import torch

from nesgpu.tasks.envs import ENVS

gym = pytest.importorskip("gymnasium")


def random_actions(env_cls, steps, rng):
    if env_cls.discrete:
        return [int(a) for a in rng.integers(0, env_cls.num_actions, steps)]
    return [rng.uniform(-1.5 * env_cls.action_high, 1.5 * env_cls.action_high, env_cls.action_dim).astype(np.float32)
            for _ in range(steps)]


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_gymnasium_step_for_step(name, seed):
    env_cls = ENVS[name]
    reference = gym.make(env_cls.gym_id).unwrapped
    obs_ref, _ = reference.reset(seed=seed)
    ours = env_cls(1)
    ours.state = torch.tensor(np.asarray(reference.state, dtype=np.float64)).view(1, -1)
    torch.testing.assert_close(ours.observe()[0], torch.from_numpy(obs_ref), rtol=0, atol=1e-6)
    rng = np.random.default_rng(seed)
    for t, action in enumerate(random_actions(env_cls, 200, rng)):
        obs_ref, reward_ref, terminated_ref, _, _ = reference.step(action)
        obs, reward, terminated = ours.step(torch.as_tensor(np.asarray(action)).view(1, -1))
        torch.testing.assert_close(obs[0], torch.from_numpy(obs_ref), rtol=1e-5, atol=1e-5, msg=f"step {t}")
        assert reward[0].item() == pytest.approx(reward_ref, rel=1e-6, abs=1e-6), f"step {t}"
        assert bool(terminated[0]) == terminated_ref, f"step {t}"
        if terminated_ref:
            break


@pytest.mark.parametrize("name", sorted(ENVS))
def test_reset_draws_gymnasium_start_distribution_and_shares_groups(name):
    env_cls = ENVS[name]
    env = env_cls(600)
    groups = torch.arange(600) % 300
    obs = env.reset(seed=3, groups=groups, count=300)
    assert obs.shape == (600, env_cls.obs_dim) and obs.dtype == torch.float32
    torch.testing.assert_close(env.state[:300], env.state[300:], rtol=0, atol=0)
    space = gym.make(env_cls.gym_id).unwrapped
    lows = []
    for s in range(50):
        space.reset(seed=s)
        lows.append(np.asarray(space.state, dtype=np.float64))
    ref = np.stack(lows)
    ours = env.state[:300].numpy()
    # same support: our draws stay within the range gymnasium's draws span (with a small margin)
    span = ref.max(0) - ref.min(0) + 1e-9
    assert (ours.min(0) >= ref.min(0) - 0.1 * span).all() and (ours.max(0) <= ref.max(0) + 0.1 * span).all()
