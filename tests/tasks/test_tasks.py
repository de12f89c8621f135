"""Tasks: the fitness of every member is what that member alone would score."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nesgpu
from nesgpu.tasks import ClassificationTask, GymVectorEnv, ObservationNorm, RLTask, make_task, rollout
from nesgpu.tasks.envs import CartPole


def test_classification_fitness_is_minus_each_members_loss():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (50,), generator=gen)
    task = ClassificationTask(x, y, x[:10], y[:10], batch_size=6, seed=1)
    model = nesgpu.convert(nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double(), "permuted")
    pm = nesgpu.PerturbedModel(model, 4, sigma=0.3, antithetic=True)
    pm.set_noise(step=2)
    fitness, info = task.fitness(pm, step=2)
    assert fitness.shape == (2, 4)
    xb, yb = task.batch(2)
    z = pm.dense_noise()
    for s, sign in enumerate([1.0, -1.0]):
        for d in range(4):
            h = torch.tanh(F.linear(xb, model[0].weight + 0.3 * sign * z["0.weight"][d],
                                    model[0].bias + 0.3 * sign * z["0.bias"][d]))
            logits = F.linear(h, model[2].weight + 0.3 * sign * z["2.weight"][d], model[2].bias + 0.3 * sign * z["2.bias"][d])
            torch.testing.assert_close(fitness[s, d], -F.cross_entropy(logits, yb))
    assert torch.equal(task.batch(2)[0], xb)  # batches are a function of (seed, step)
    assert not torch.equal(task.batch(3)[0], xb)


def test_classification_from_datasets_and_bad_input():
    data = torch.utils.data.TensorDataset(torch.randn(20, 3), torch.randint(0, 2, (20,)))
    task = ClassificationTask.from_datasets(data, data, batch_size=4)
    assert task.num_classes == 2 and task.input_shape == (3,)
    assert 0.0 <= task.evaluate(task.make_model((4,))) <= 1.0
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ClassificationTask(torch.zeros(2, 1), torch.zeros(2), torch.zeros(2, 1), torch.zeros(2), batch_size=0)
    with pytest.raises(ValueError, match="differ in length"):
        ClassificationTask(torch.zeros(3, 1), torch.zeros(2), torch.zeros(2, 1), torch.zeros(2))


@pytest.mark.parametrize("name", ["digits", "mnist1d"])
def test_offline_datasets(name):
    task = make_task(name, batch_size=8)
    assert task.x_train.dtype == torch.float32 and task.num_classes == 10
    assert len(task.x_test) > 300


def test_rollout_rows_are_independent_episodes():
    """Batched rollout of a perturbed policy = each member's own episode, one at a time."""
    task = make_task("cartpole", seed=3)
    policy = task.make_model((8,))
    pm = nesgpu.PerturbedModel(nesgpu.convert(policy, "lowrank"), 4, sigma=0.5, antithetic=True)
    pm.set_noise()
    groups = torch.zeros(8, dtype=torch.long)
    returns, lengths, _ = rollout(CartPole(8), pm, groups, seed=11, max_steps=500, count=1)
    z = pm.dense_noise()
    for n in range(8):
        sign, d = (1.0 if n < 4 else -1.0), n % 4
        member = task.make_model((8,))
        member.load_state_dict(policy.state_dict())
        with torch.no_grad():
            for name, p in member.named_parameters():
                p.add_(0.5 * sign * z[name][d])
        single, length, _ = rollout(CartPole(1), member, torch.zeros(1, dtype=torch.long), seed=11, max_steps=500,
                                    count=1)
        assert returns[n] == single[0] and lengths[n] == length[0]


def test_observation_norm_matches_batch_statistics():
    gen = torch.Generator().manual_seed(0)
    norm = ObservationNorm(3)
    chunks = [torch.randn(n, 3, generator=gen, dtype=torch.float64) * 3 + 1 for n in (5, 17, 40)]
    for c in chunks:
        norm.update(c.sum(0), c.square().sum(0), torch.tensor(float(len(c)), dtype=torch.float64))
    data = torch.cat(chunks)
    torch.testing.assert_close(norm.mean, data.mean(0))
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False))
    assert norm(torch.full((1, 3), 1e6)).max() == 5.0  # clipped


def test_observation_norm_forward_follows_every_change_of_its_buffers():
    norm = ObservationNorm(3)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))

    def expected(m):
        return ((x.double() - m.mean) / (m.var + m.eps).sqrt()).clamp(-5, 5).float()

    torch.testing.assert_close(norm(x), x.clamp(-5, 5))
    batch = torch.randn(9, 3, dtype=torch.float64) * 2 + 3
    norm.update(batch.sum(0), batch.square().sum(0), torch.tensor(9.0, dtype=torch.float64))  # in place
    torch.testing.assert_close(norm(x), expected(norm))
    other = ObservationNorm(3)
    other.load_state_dict({"mean": torch.full((3,), -2.0, dtype=torch.float64),
                           "var": torch.full((3,), 4.0, dtype=torch.float64),
                           "count": torch.tensor(1.0, dtype=torch.float64)})
    norm.load_state_dict(other.state_dict())  # copied into the same buffers
    torch.testing.assert_close(norm(x), expected(other))
    norm.load_state_dict({k: v * 2 for k, v in other.state_dict().items()}, assign=True)  # new tensors
    torch.testing.assert_close(norm(x), expected(norm))
    assert norm(x.double()).dtype == torch.float64
    with torch.inference_mode():
        fresh = ObservationNorm(3)
        torch.testing.assert_close(fresh(x), x.clamp(-5, 5))


def test_rollout_observation_statistics_count_each_live_row_once_per_step():
    task = make_task("cartpole", seed=2)
    policy = task.make_model((4,))
    env = CartPole(6)
    seen, ended = [], []
    env_step = env.step

    def step(action):  # record what the environment says, independently of the rollout's bookkeeping
        obs, reward, terminated = env_step(action)
        ended.append(terminated.clone())
        return obs, reward, terminated

    env.step = step

    def act(obs):
        seen.append(obs.double())
        return policy(obs)

    with torch.no_grad():
        _, lengths, stats = rollout(env, act, torch.arange(6), seed=3, max_steps=500, obs_stats=True)
    assert lengths.min() < lengths.max()  # some episodes end early, so masking matters
    alive, masks = torch.ones(6, dtype=torch.bool), []
    for terminated in ended:  # a row observes at step t if it had not terminated before t
        masks.append(alive.clone())
        alive &= ~terminated
    mask = torch.stack(masks).unsqueeze(2)  # (T, n, 1)
    obs = torch.stack(seen)
    torch.testing.assert_close(stats["sum"], (obs * mask).sum((0, 1)))
    torch.testing.assert_close(stats["sum_sq"], (obs.square() * mask).sum((0, 1)))
    assert stats["count"] == mask.sum()


def test_rl_task_fitness_layout_and_stats():
    task = make_task("pendulum", episodes=2)
    model = nesgpu.convert(task.make_model((8,)), "flipout")
    pm = nesgpu.PerturbedModel(model, 6, sigma=0.1, antithetic=True)
    pm.set_noise()
    fitness, info = task.fitness(pm, step=1)
    assert fitness.shape == (4, 6)  # (sign * episode, direction)
    assert int(info["env_steps"]) == 4 * 6 * 200
    assert model.norm.count.item() == 0  # statistics wait for the whole population
    task.finish_step(pm, info)
    assert model.norm.count.item() == 4 * 6 * 200
    task.normalize_observations = False
    _, info = task.fitness(pm, step=2)
    task.finish_step(pm, info)
    assert model.norm.count.item() == 4 * 6 * 200


def test_gym_adapter_matches_sequential_gymnasium_episodes():
    gym = pytest.importorskip("gymnasium")
    env = GymVectorEnv("CartPole-v1", 6)
    policy = lambda obs: (obs[:, 2] + 0.3 * obs[:, 3] > 0).long()  # noqa: E731
    groups = torch.tensor([0, 1, 2, 0, 1, 2])
    returns, lengths, _ = rollout(env, policy, groups, seed=5, max_steps=500, count=3)
    assert torch.equal(returns[:3], returns[3:])  # same group, same start, same deterministic policy
    from nesgpu.noise import derive_seed

    for n in range(3):
        single = gym.make("CartPole-v1")
        obs, _ = single.reset(seed=derive_seed(5, n) % 2**31)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = single.step(int(policy(torch.as_tensor(obs).view(1, -1))[0]))
            total += r
            done = term or trunc
        assert returns[n].item() == total


def test_gym_task_runs_through_the_trainer_interfaces():
    pytest.importorskip("gymnasium")
    task = make_task("gym:Pendulum-v1", eval_episodes=2)
    assert isinstance(task, RLTask) and task.spec.obs_dim == 3 and not task.spec.discrete
    pm = nesgpu.PerturbedModel(nesgpu.convert(task.make_model((4,)), "lowrank"), 3, antithetic=True)
    pm.set_noise()
    fitness, _ = task.fitness(pm, 1)
    assert fitness.shape == (2, 3) and np.isfinite(fitness.numpy()).all()
    assert task.evaluate(pm.model) < 0


@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_task_feeds_the_same_batches_as_the_in_memory_task(workers):
    from nesgpu.tasks import StreamingClassificationTask

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 17, (60, 5), generator=gen).float(), torch.randint(0, 3, (60,), generator=gen)
    data = torch.utils.data.TensorDataset(x, y)
    in_memory = ClassificationTask(x / 16.0, y, x[:10] / 16.0, y[:10], batch_size=7, seed=4)
    streaming = StreamingClassificationTask(data, torch.utils.data.TensorDataset(x[:10], y[:10]), batch_size=7,
                                            seed=4, num_workers=workers, std=16.0)  # normalised on the device
    for step in (1, 2, 3):
        xs, ys = streaming.batch(step)
        assert streaming.batch(step)[0] is xs  # every chunk of a step sees the same batch
        xm, ym = in_memory.batch(step)
        torch.testing.assert_close(xs, xm)
        assert torch.equal(ys, ym)
    with pytest.raises(ValueError, match="data stream is at step 4"):
        streaming.batch(9)
    resumed = StreamingClassificationTask(data, torch.utils.data.TensorDataset(x[:10], y[:10]), batch_size=7,
                                          seed=4, num_workers=0, std=16.0, first_step=3)
    torch.testing.assert_close(resumed.batch(3)[0], in_memory.batch(3)[0])
    # and it trains through the usual interfaces
    model = nesgpu.convert(streaming.make_model((4,)), "lowrank")
    pm = nesgpu.PerturbedModel(model, 4, antithetic=True)
    pm.set_noise(step=4)
    fitness, _ = streaming.fitness(pm, 4)
    assert fitness.shape == (2, 4)
    assert 0.0 <= streaming.evaluate(model) <= 1.0


def test_weights_of_an_old_unnormalised_policy_still_load_and_act_the_same():
    # nesgpu 0.1.0 gave ARS V1 policies a never-updated ObservationNorm (identity statistics, clip at +-5)
    from nesgpu.tasks.rl import ObservationNorm, Policy

    old = Policy(3, False, 1, 2.0, (4,), normalize=True)
    new = Policy(3, False, 1, 2.0, (4,), normalize=False)
    new.load_state_dict(old.state_dict())
    assert isinstance(new.norm, ObservationNorm)
    obs = torch.tensor([[9.0, -7.0, 0.5]])
    torch.testing.assert_close(new(obs), old(obs))


@pytest.mark.parametrize("spaces, expected", [
    (dict(discrete=True), "declares discrete = True with num_actions = 0; a discrete environment declares "
                          "num_actions >= 2"),
    (dict(discrete=False, action_dim=0), "declares discrete = False with action_dim = 0"),
])
def test_an_environment_without_its_action_space_is_named(spaces, expected):
    from nesgpu.tasks.envs.base import TorchEnv

    Env = type("Env", (TorchEnv,), dict(obs_dim=2, state_dim=2, max_steps=10, gym_id=None, **spaces))
    with pytest.raises(ValueError, match=f"Env {expected}"):
        RLTask(lambda n, device: Env(n, device), Env, name="env")
    with pytest.raises(TypeError, match="NoSteps declares no max_steps"):
        RLTask(lambda n, device: None, type("NoSteps", (), dict(obs_dim=2, discrete=True, num_actions=2)), name="x")
