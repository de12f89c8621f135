"""What the ARS paper's algorithm needs of the RL tasks: the survival-bonus shift, a start state per rollout,
the unsquashed linear policy, unclipped observation statistics, and the ars-paper preset."""

import json

import numpy as np
import pytest
import torch

import nesgpu
from nesgpu.tasks import GymVectorEnv, ObservationNorm, make_task
from nesgpu.tasks.rl import Policy
from nesgpu.train import TrainConfig, train
from nesgpu.train.setup.ars_paper import ARS_PAPER, preset_values

QUIET = dict(log=lambda *a, **k: None)


def population(task, directions=8, sigma=0.5, seed=3):
    model = nesgpu.convert(task.make_model((4,)), "gaussian")
    pm = nesgpu.PerturbedModel(model, directions, sigma=sigma, antithetic=True, seed=seed)
    pm.set_noise(step=1)
    return pm


def test_reward_shift_subtracts_one_per_live_step_from_training_returns_only():
    plain, shifted = make_task("cartpole", seed=1), make_task("cartpole", seed=1, reward_shift=1.0)
    pm = population(plain)
    f0, info0 = plain.fitness(pm, 1)
    f1, info1 = shifted.fitness(pm, 1)
    # CartPole pays 1 per live step, so the shifted return of every rollout is exactly 0
    assert torch.all(f0 > 0) and torch.equal(f1, torch.zeros_like(f1))
    assert info0["env_steps"] == info1["env_steps"]
    assert plain.evaluate(pm.model) == shifted.evaluate(pm.model)  # evaluations are unshifted


def test_reward_shift_by_hand_on_pendulum():
    plain, shifted = make_task("pendulum", seed=0), make_task("pendulum", seed=0, reward_shift=0.25)
    pm = population(plain, directions=4)
    f0, _ = plain.fitness(pm, 2)
    f1, _ = shifted.fitness(pm, 2)
    torch.testing.assert_close(f1, f0 - 0.25 * 200)  # 200 steps, none ends early


def test_independent_start_states_differ_per_rollout_and_do_not_depend_on_blocks():
    task = make_task("pendulum", seed=5, start_states="independent")
    pm = population(task, directions=8, sigma=1e-9)  # (almost) the same policy everywhere: returns = starts
    whole, _ = task.fitness(pm, 1)
    def distinct(f):
        return len({round(v, 3) for v in f.flatten().tolist()})
    assert distinct(whole) == whole.numel()  # 16 rollouts, 16 different start states
    parts = []
    for block in (range(0, 3), range(3, 8)):  # chunks (or ranks) see the states of their own directions
        pm.set_noise(step=1, directions=block)
        parts.append(task.fitness(pm, 1)[0])
    torch.testing.assert_close(torch.cat(parts, dim=1), whole)
    shared = make_task("pendulum", seed=5)
    pm.set_noise(step=1)
    f, _ = shared.fitness(pm, 1)
    assert distinct(f) == 1  # common random numbers: one start state per step


def test_linear_policy_output_is_not_squashed():
    torch.manual_seed(0)
    policy = Policy(3, False, 1, 2.0, (), output="linear")
    with torch.no_grad():
        policy.net[0].weight.fill_(10.0)
    obs = torch.ones(2, 3)
    assert torch.allclose(policy(obs), torch.full((2, 1), 30.0))
    tanh = Policy(3, False, 1, 2.0, (), output="tanh")
    tanh.load_state_dict(policy.state_dict())
    assert torch.allclose(tanh(obs), torch.full((2, 1), 2.0))
    with pytest.raises(ValueError, match="policy output must be one of"):
        Policy(3, False, 1, 2.0, (), output="relu")


def test_auto_policy_output_is_linear_for_ars_linear_policies_only():
    def output(**kw):
        return TrainConfig.flat(**kw).resolved().option("policy_output")
    assert output(task="pendulum", strategy="ars", hidden=()) == "linear"
    assert output(task="pendulum", strategy="ars", hidden=(8,)) == "tanh"
    assert output(task="pendulum") == "tanh"
    assert output(task="pendulum", strategy="ars", hidden=(), policy_output="tanh") == "tanh"


def test_observation_norm_without_clipping_and_with_a_floor():
    norm = ObservationNorm(2, clip=None)
    batch = torch.tensor([[0.0, 1.0], [0.0, 3.0]], dtype=torch.float64)  # feature 0 constant so far
    norm.update(batch.sum(0), batch.square().sum(0), torch.tensor(2.0, dtype=torch.float64))
    out = norm(torch.tensor([[1e-3, 102.0]]))
    assert out[0, 0] == 0.0  # a constant feature is zeroed, not multiplied by 1e4
    assert out[0, 1] == pytest.approx(100.0, rel=1e-6)  # (102 - 2) / 1: not clipped at 5
    assert ObservationNorm(2)(torch.tensor([[1e6, -1e6]])).abs().max() == 5.0  # the default still clips


def test_gym_adapter_passes_a_linear_policys_actions_unclipped():
    pytest.importorskip("gymnasium")
    for clip, expected in ((True, 2.0), (False, 7.0)):
        env = GymVectorEnv("Pendulum-v1", 2, clip_actions=clip)
        env.reset(0, torch.arange(2), 2)
        seen = []
        row = env.env.envs[0]  # sync mode steps each live row's env
        step = row.step
        row.step = lambda a: (seen.append(np.array(a)), step(a))[1]
        env.step(torch.full((2, 1), 7.0))
        assert seen[0].max() == pytest.approx(expected)
        env.close()


def test_ars_paper_preset_sets_the_papers_values_and_keeps_explicit_options():
    cfg = TrainConfig(task="gym:HalfCheetah-v5", preset="ars-paper").resolved()
    alpha, n, b, nu, shift, threshold, _ = ARS_PAPER["HalfCheetah"]
    assert (cfg.strategy, cfg.layer, cfg.hidden, cfg.population, cfg.option("top_b"), cfg.sigma, cfg.lr, cfg.option("reward_shift"),
            cfg.target) == ("ars", "gaussian", (), 2 * n, b, nu, alpha, shift, threshold)
    assert (cfg.option("start_states"), cfg.option("policy_output"), cfg.option("observation_clip"), cfg.eval_every, cfg.option("eval_episodes")) == (
        "independent", "linear", 0.0, 10, 100)
    hopper = TrainConfig(task="gym:Hopper-v5", preset="ars-paper", sigma=0.05, population=32).resolved()
    assert (hopper.sigma, hopper.population, hopper.option("reward_shift")) == (0.05, 32, 1.0)
    with pytest.raises(ValueError, match="knows the MuJoCo tasks"):
        TrainConfig(task="cartpole", preset="ars-paper").resolved()
    with pytest.raises(ValueError, match="preset must be one of"):
        preset_values("es-paper", "gym:Hopper-v5")


def test_ars_paper_config_round_trips_through_yaml(tmp_path):
    cfg = TrainConfig(task="gym:Walker2d-v5", preset="ars-paper").resolved()
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    assert TrainConfig.from_yaml(tmp_path / "c.yaml").resolved() == cfg


@pytest.mark.parametrize("kw, message", [
    (dict(task="digits", reward_shift=1.0), "applies to task 'cartpole' or .*, not to task 'digits'"),
    (dict(task="digits", start_states="independent"), "applies to task 'cartpole' or .*, not to task 'digits'"),
    (dict(task="cartpole", observation_clip=-1.0), "observation_clip"),
    (dict(task="cartpole", reward_shift=float("nan")), "reward_shift"),
])
def test_bad_rl_options(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.flat(**kw).resolved()


def test_old_runs_keep_their_tanh_policy_and_clipping(tmp_path):
    out = tmp_path / "r"
    train(TrainConfig.flat(task="pendulum", strategy="ars", hidden=(), population=8, steps=2, out=str(out), log="none",
                      policy_output="tanh", observation_clip=5.0), **QUIET)
    config = json.loads((out / "config.json").read_text())
    for key in ("policy_output", "observation_clip", "start_states", "reward_shift"):
        del config[key]  # as written by nesgpu before these options
    (out / "config.json").write_text(json.dumps(config))
    model, task, cfg = nesgpu.load_run(out, device="cpu")
    assert model.output == "tanh" and model.norm.clip == 5.0 and cfg.option("policy_output") == "tanh"
    # resuming it under today's ARS defaults (linear, unclipped) is refused: they define the run
    with pytest.raises(ValueError, match="policy_output"):
        train(TrainConfig.flat(task="pendulum", strategy="ars", hidden=(), population=8, steps=4, out=str(out),
                          log="none", policy_output="linear", observation_clip=5.0), resume=True, **QUIET)


def test_sync_gym_rows_are_not_simulated_after_their_episode_ends():
    pytest.importorskip("gymnasium")
    env = GymVectorEnv("CartPole-v1", 3)
    env.reset(0, torch.arange(3), 3)
    calls = [0, 0, 0]
    for i, row in enumerate(env.env.envs):
        step = row.step
        row.step = lambda a, i=i, step=step: (calls.__setitem__(i, calls[i] + 1), step(a))[1]
    ended_at = [None] * 3
    for t in range(60):  # always push right: every pole falls within a few dozen steps
        _, reward, done = env.step(torch.ones(3, dtype=torch.long))
        for i in range(3):
            if done[i] and ended_at[i] is None:
                ended_at[i] = t + 1
            if ended_at[i] is not None and t + 1 > ended_at[i]:
                assert reward[i] == 0
    assert all(e is not None for e in ended_at) and calls == ended_at
    env.close()


def test_a_presets_option_given_explicitly_keeps_its_value_even_the_default(capsys):
    from nesgpu.cli import main

    assert main(["train", "--task", "gym:HalfCheetah-v5", "--preset", "ars-paper", "--start-states", "shared",
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "start_states: shared" in printed and "population: 64" in printed and "preset: null" in printed
    cfg = TrainConfig.from_dict({"task": "gym:Hopper-v5", "preset": "ars-paper", "layer": "lowrank"}).resolved()
    assert cfg.layer == "lowrank" and cfg.option("reward_shift") == 1.0 and cfg.preset is None
    # built in Python with the preset as data: what is passed is kept, even a default's value
    built = TrainConfig.with_preset("ars-paper", task="gym:Hopper-v5", layer="lowrank", eval_episodes=10)
    assert (built.layer, built.option("eval_episodes"), built.preset, built.population) == ("lowrank", 10, None, 16)
    assert built.resolved().layer == "lowrank" and built.resolved().option("eval_episodes") == 10
    assert TrainConfig.with_preset("ars-paper", task="gym:Hopper-v5").option("top_b") == 4
    # TrainConfig(preset=...) expands when resolved, over what is still at its default
    assert TrainConfig(task="gym:Hopper-v5", preset="ars-paper", sigma=0.5).resolved().sigma == 0.5
    late = TrainConfig(task="gym:Hopper-v5")
    late.preset = "ars-paper"  # set after the build: the options still at their defaults take the preset's
    assert late.resolved().layer == "gaussian" and late.resolved().population == 16
