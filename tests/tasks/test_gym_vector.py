"""GymVectorEnv's vector modes (sync / async worker processes) and its handling of warnings that repeat per step."""

import gc
import multiprocessing
import warnings

import pytest
import torch

gym = pytest.importorskip("gymnasium")

import nesgpu  # noqa: E402
from nesgpu.tasks import GymVectorEnv, make_task, rollout  # noqa: E402
from nesgpu.tasks import gym as gym_module  # noqa: E402
from nesgpu.tasks.gym_warnings import EnvWarnings, MujocoWarning, dedup_key  # noqa: E402

FORKS = gym_module._async_context() == "fork"  # the test env registered here reaches the workers only by fork


def linear_policy(env_id: str, seed: int = 0):
    """A small fixed torch policy for ``env_id`` (a seeded linear map, tanh-squashed for Box actions)."""
    spec = GymVectorEnv.spec(env_id)
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(spec.obs_dim, spec.num_actions or spec.action_dim, generator=gen) * 0.5
    if spec.discrete:
        return lambda obs: (obs @ weight).argmax(-1)
    return lambda obs: spec.action_high * torch.tanh(obs @ weight)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1", "InvertedPendulum-v5"])
def test_async_returns_equal_sync_returns(env_id):
    if env_id.endswith("-v5"):
        pytest.importorskip("mujoco")
    act = linear_policy(env_id)
    groups = torch.tensor([0, 1, 2, 0, 1, 2])
    results = {}
    for mode in ("sync", "async"):
        with GymVectorEnv(env_id, 6, vector_mode=mode) as env:
            assert env.vector_mode == mode
            start = env.reset(7, groups, 3)
            assert torch.equal(start[:3], start[3:])  # rows of the same group start from the same state
            results[mode] = [rollout(env, act, groups, seed=s, max_steps=300, count=3)[:2] for s in (7, 8)]
    for (sync_returns, sync_lengths), (async_returns, async_lengths) in zip(results["sync"], results["async"]):
        assert torch.equal(sync_returns, async_returns) and torch.equal(sync_lengths, async_lengths)
        assert sync_returns.dtype == torch.float64


def test_async_task_fitness_equals_sync_fitness():
    fitness = {}
    for mode in ("sync", "async"):
        task = make_task("gym:Pendulum-v1", vector_mode=mode, eval_episodes=2)
        torch.manual_seed(0)  # the same model, the same noise
        model = task.make_model((4,))
        pm = nesgpu.PerturbedModel(nesgpu.convert(model, "lowrank"), 3, antithetic=True)
        pm.set_noise()
        fitness[mode], _ = task.fitness(pm, 1)
        assert task._env.vector_mode == mode
        task._env.close()
    assert torch.equal(fitness["sync"], fitness["async"])


def test_bad_vector_mode_is_refused():
    with pytest.raises(ValueError, match=r"\('sync', 'async'\).*'threads'"):
        GymVectorEnv("Pendulum-v1", 2, vector_mode="threads")
    with pytest.raises(ValueError, match=r"\['sync', 'async'\]; got 'ASYNC'"):
        make_task("gym:Pendulum-v1", vector_mode="ASYNC")
    with pytest.raises(ValueError, match="'bogus'"):
        make_task("cartpole", vector_mode="bogus")


@pytest.mark.parametrize("name", ["cartpole", "digits"])
def test_non_gym_task_refuses_async(name):
    refusal = f"'vector_mode' \\(= 'async'\\) applies to task 'gym:<id>', not to task {name!r}"
    with pytest.raises(ValueError, match=refusal):
        make_task(name, vector_mode="async")
    with pytest.raises(ValueError, match="applies to task 'gym:<id>'"):  # even at gym's default: it is not cartpole's
        make_task(name, vector_mode="sync")


def _alive(processes):
    for p in processes:
        p.join(timeout=120)
    return [p for p in processes if p.is_alive()]


def test_async_worker_processes_end_with_close_and_with_the_object():
    env = GymVectorEnv("Pendulum-v1", 3, vector_mode="async")
    processes = list(env.env.processes)
    assert len(processes) == 3 and all(p.is_alive() for p in processes)
    env.close()
    assert env.closed and not _alive(processes)
    env.close()  # twice is fine

    env = GymVectorEnv("Pendulum-v1", 2, vector_mode="async")
    processes = list(env.env.processes)
    del env  # RLTask drops its env this way (a new row count, the end of evaluate)
    gc.collect()
    assert not _alive(processes)


def test_rl_task_evaluate_leaves_no_async_workers():
    task = make_task("gym:Pendulum-v1", vector_mode="async", eval_episodes=3)
    before = set(multiprocessing.active_children())
    task.evaluate(task.make_model((4,)))  # makes its own env of eval_episodes rows and drops it
    gc.collect()
    left = [p for p in multiprocessing.active_children() if p not in before]
    assert not _alive(left)


class _WarnsEveryStep(gym.Env):
    """Pendulum-like toy that warns at creation, at every reset and at every step."""

    def __init__(self):
        warnings.warn("toy env: made", UserWarning)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        warnings.warn("toy env: reset", DeprecationWarning)
        return self.np_random.uniform(-1, 1, 2).astype("float32"), {}

    def step(self, action):
        warnings.warn("toy env: stepped", UserWarning)
        return self.np_random.uniform(-1, 1, 2).astype("float32"), float(action[0]), False, False, {}


TOY_ID = "NesgpuTestWarnsEveryStep-v0"
if TOY_ID not in gym.registry:
    gym.register(TOY_ID, entry_point=_WarnsEveryStep, max_episode_steps=50, disable_env_checker=True)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_warning_repeated_every_step_is_shown_once(mode, recwarn):
    if mode == "async" and not FORKS:
        pytest.skip("the toy env is registered in this process only; spawned workers do not see it")
    warnings.simplefilter("always")  # the user asked for every repeat; repeats inside env calls still go
    with GymVectorEnv(TOY_ID, 4, vector_mode=mode) as env:
        for seed in range(3):
            _, lengths, _ = rollout(env, lambda obs: torch.zeros(obs.shape[0], 1), torch.arange(4), seed, 20)
        assert lengths.tolist() == [20] * 4
    texts = [str(w.message) for w in recwarn.list]
    for text in ("toy env: made", "toy env: reset", "toy env: stepped"):
        assert texts.count(text) == 1, (text, texts)
    warnings.warn("toy env: stepped", UserWarning)  # outside the env's calls nothing is filtered
    assert [str(w.message) for w in recwarn.list].count("toy env: stepped") == 2


def test_the_envs_of_one_task_share_what_they_showed_and_others_do_not(recwarn):
    warnings.simplefilter("always")
    shown = EnvWarnings()
    for _ in range(2):  # two envs of one task (its training and evaluation rows): shown once between them
        with GymVectorEnv(TOY_ID, 2, env_warnings=shown) as env:
            rollout(env, lambda obs: torch.zeros(obs.shape[0], 1), torch.arange(2), 0, 3)
    with GymVectorEnv(TOY_ID, 2) as env:  # an env of its own: its own first time
        rollout(env, lambda obs: torch.zeros(obs.shape[0], 1), torch.arange(2), 0, 3)
    assert [str(w.message) for w in recwarn.list].count("toy env: stepped") == 2
    assert ("toy env: stepped" in {text for _, text in shown.shown})


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_warning_filters_still_apply_inside_env_calls(mode):
    if mode == "async" and not FORKS:
        pytest.skip("the toy env is registered in this process only; spawned workers do not see it")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = GymVectorEnv(TOY_ID, 2, vector_mode=mode)
    with env, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="toy env: made")  # async: the workers' creation warnings
        warnings.filterwarnings("error", message="toy env: stepped")
        env.reset(0, torch.arange(2), 2)
        with pytest.raises(UserWarning, match="toy env: stepped"):
            env.step(torch.zeros(2, 1))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_mujoco_messages_become_one_python_warning(mode, recwarn, tmp_path, monkeypatch):
    mujoco = pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo's own handler would append to ./MUJOCO_LOG.TXT
    warnings.simplefilter("always")
    with GymVectorEnv("HalfCheetah-v5", 3, vector_mode=mode) as env:  # each row compiles the model
        rollout(env, lambda obs: torch.zeros(obs.shape[0], 6), torch.arange(3), 0, 5)
    caught = [w for w in recwarn.list if issubclass(w.category, MujocoWarning)]
    assert len(caught) <= 1  # one, while HalfCheetah's XML uses the deprecated settotalmass
    assert all(w.filename == "mujoco" for w in caught)
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert mujoco.get_mju_user_warning() is None  # the handler is ours only during the env's calls


def test_mujoco_time_stamps_do_not_make_messages_new():
    key = dedup_key
    warning = MujocoWarning
    a = "Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable. Time = 0.0150."
    b = "Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable. Time = 2.5000."
    assert key(warning, a) == key(warning, b) and key(UserWarning, a) != key(UserWarning, b)
