"""TrainConfig is the one source of the options: the CLI is generated from it, presets come from one
function, strategies from the registry, and the population step has one owner."""

import dataclasses

import pytest
import torch

from nesgpu.cli import build_parser, main
from nesgpu.frontends.train_flags import Chosen, layer_option_flags, shown
from nesgpu.kinds import KINDS
from nesgpu.model import PerturbedModel
from nesgpu.strategies import STRATEGIES
from nesgpu.tasks import make_task
from nesgpu.tasks.protocol import Task, check_task
from nesgpu.train import TrainConfig
from nesgpu.train.setup.build import build
from nesgpu.train.setup.config import presets


def train_parser(*argv):
    return build_parser(["train", *argv])._subparsers._group_actions[0].choices["train"]


def test_every_field_and_every_layer_option_has_a_flag_with_its_default_in_help():
    actions = {a.dest: a for a in train_parser()._actions}
    for f in dataclasses.fields(TrainConfig):
        if f.name != "layer_options" and not f.metadata.get("component"):
            assert f.name in actions, f.name
            if shown(f.name, Chosen()) and f.name != "model":  # the model's help is the task's own
                assert f.metadata["help"] in actions[f.name].help
                assert "default" in actions[f.name].help or f.default in (None, dataclasses.MISSING)
    for name, kind in KINDS.items():  # the chosen kind's options, and only its
        layer = {a.dest for a in train_parser("--layer", name)._actions if a.dest.startswith("layer_option:")}
        assert layer == {f"layer_option:{f.name}" for f in dataclasses.fields(kind)}, name
    assert {"--rank", "--sparse-k", "--in-sparsity", "--signs", "--permutation"} <= set(layer_option_flags())
    help_text = " ".join(train_parser().format_help().split())
    assert "(default: 512)" in help_text and "(default: lowrank)" in help_text


def test_print_config_round_trips_through_yaml(tmp_path, capsys):
    assert main(["train", "--task", "cartpole", "--strategy", "openai_es", "--rank", "2", "--hidden", "8,8",
                 "--no-antithetic", "--chunk-size", "auto", "--print-config"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "c.yaml"
    path.write_text(text)
    loaded = TrainConfig.from_yaml(path)
    expected = TrainConfig(task="cartpole", strategy="openai_es", layer_options={"rank": 2}, hidden=(8, 8),
                           antithetic=False, chunk_size="auto").resolved()
    assert loaded.resolved() == expected
    assert not list(tmp_path.glob("runs"))  # printing trains nothing
    # and the file runs as a config: the flags still override it
    assert main(["train", "--config", str(path), "--steps", "1", "--population", "8", "--print-config"]) == 0
    assert "steps: 1\n" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--rank", "two"], "argument --rank: invalid int value: 'two'"),
    (["--layer", "gaussian", "--rank", "2"], "option --rank (= 2) applies to layer 'lowrank', not to layer 'gaussian'"),
    (["--hidden", "8,-1"], "layer sizes must be >= 1 (or a lone 0 for none); got '8,-1'"),
    (["--hidden", "64,0,32"], "layer sizes must be >= 1"),
    (["--top-b", "4"], "option 'top_b' (= 4) applies to strategy 'ars', not to strategy 'openai_es'"),
    (["--sigma", "nan"], "sigma must be a positive finite number or 'auto'; got nan"),
    (["--population", "0"], "population must be >= 2; got 0"),
    (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
    (["--device", "gpu"], "device must be auto, cpu, cuda or cuda:N; got 'gpu'"),
])
def test_bad_flags_are_one_line_errors(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *argv, "--steps", "1", "--out", str(tmp_path / "r")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_presets_come_from_one_function_and_strategies_bring_their_own_lr():
    assert presets("digits")["lr"] == TrainConfig().resolved().lr == 0.005  # the task's tuned lr
    for name, cls in STRATEGIES.items():
        layer = {"layer": "gaussian"} if cls.adapts_scales or cls.adapts_covariance else {}  # the IID kind carries them
        cfg = TrainConfig(task="digits", strategy=name, **layer).resolved()
        assert cfg.lr == (0.005 if name == "openai_es" else cls.default_lr)
    assert TrainConfig(task="cartpole").resolved().strategy == "pgpe"
    assert TrainConfig(task="mnist1d", model="cnn").resolved().hidden == (32, 32, 32)
    # an ARS run's preset weight decay (digits' own) is not an error on resume or from --print-config
    values = TrainConfig(task="digits", strategy="ars").resolved().to_dict()
    assert TrainConfig.flat(**values).resolved().strategy == "ars"


@pytest.mark.parametrize("name", ["digits", "reverse", "cartpole", "pendulum"])
def test_every_task_meets_the_task_protocol(name):
    task = make_task(name)
    assert isinstance(task, Task) and check_task(task) is task
    with pytest.raises(TypeError, match=r"a task needs \['metric'"):
        check_task(object())


def test_ars_v1_policies_see_raw_observations():
    cpu = torch.device("cpu")
    v1 = build(TrainConfig.flat(task="pendulum", strategy="ars", ars_version="v1", hidden=()).resolved(), cpu)
    v2 = build(TrainConfig(task="pendulum", strategy="ars", hidden=()).resolved(), torch.device("cpu"))
    assert isinstance(v1[1].norm, torch.nn.Identity) and not v1[0].normalize_observations
    assert not isinstance(v2[1].norm, torch.nn.Identity) and v2[0].normalize_observations


def small_step(chunk, **cfg):
    cfg = TrainConfig.flat(task="digits", population=32, hidden=(8,), batch_size=8, layer="gaussian", **cfg).resolved()
    cfg.chunk_size = chunk
    built = build(cfg, torch.device("cpu"), log=lambda *a: None)
    return built.step, built.model


def test_a_population_that_cannot_fit_is_refused_up_front_with_what_it_needs(monkeypatch):
    shared, per_direction = small_step(None)[0].population.blocks.noise_bytes_per_direction()
    assert (shared, per_direction) == (0, (64 * 8 + 8 + 8 * 10 + 10) * 4)  # IID noise: every parameter, fp32
    monkeypatch.setenv("NESGPU_FREE_MEMORY", str(per_direction * 80))  # 16 directions + a drawn block of 32 fit
    assert small_step(None)[0].chunk == 16
    monkeypatch.setenv("NESGPU_FREE_MEMORY", str(per_direction * 40))
    with pytest.raises(ValueError, match=r"the noise of a block of 16 directions needs 0.00 GiB, but cpu has "
                                         r"0.00 GiB free; use --chunk-size auto"):
        small_step(None)
    auto, _ = small_step("auto")  # the largest block whose noise (and one drawn block) fits in half: none
    assert auto.chunk == 1
    monkeypatch.setenv("NESGPU_FREE_MEMORY", str(per_direction * 90))
    assert small_step("auto")[0].chunk == 90 // 2 - 32 == 13
    monkeypatch.setenv("NESGPU_FREE_MEMORY", str(per_direction * 100))
    assert small_step("auto")[0].chunk == 16  # 18 would fit: the whole share (16)
    monkeypatch.setenv("NESGPU_FREE_MEMORY", str(per_direction * 20))
    with pytest.raises(ValueError, match="the noise of one direction needs .* the model is too large"):
        small_step("auto")
    monkeypatch.setenv("NESGPU_FREE_MEMORY", "4GB")
    with pytest.raises(ValueError, match="NESGPU_FREE_MEMORY must be a number of bytes; got '4GB'"):
        small_step(None)


def test_one_owner_cuts_the_blocks_and_a_chunked_step_equals_a_whole_one():
    whole, model_a = small_step(None)
    chunked, model_b = small_step(3)
    assert [len(b) for b in chunked.population.blocks.forward_blocks()] == [3, 3, 3, 3, 3, 1]
    assert chunked.population.blocks.update_blocks() == chunked.population.blocks.forward_blocks()
    for _ in range(2):
        a, b = whole.run(), chunked.run()
        assert a["fitness_mean"] == pytest.approx(b["fitness_mean"], rel=1e-6)
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [None, 1, 4, 5])
def test_the_population_cuts_blocks_that_cover_the_directions_in_order(chunk):
    from nesgpu import convert
    from nesgpu.population import Population

    pm = PerturbedModel(convert(torch.nn.Sequential(torch.nn.Linear(3, 2)), "gaussian"), 6, sigma=0.1, antithetic=True)
    population = Population(pm, chunk=chunk, log=lambda *a: None)
    for blocks in (population.blocks.forward_blocks(), population.blocks.update_blocks()):
        assert [d for b in blocks for d in b] == list(range(6)) and all(len(b) <= (chunk or 6) for b in blocks)
    with pytest.raises(ValueError, match=r"chunk must be None, 'auto' or a number of directions in \[1, 6\]"):
        Population(pm, chunk=7)


def test_a_yaml_resumes_its_own_values_and_cannot_redirect_the_resume(tmp_path, capsys):
    base = ["--task", "cartpole", "--population", "8", "--hidden", "4", "--steps", "2"]
    assert main(["train", *base, "--sigma-schedule", "linear", "--sigma-final", "0.5", "--out", str(tmp_path / "a"),
                 "--strategy", "openai_es"]) == 0
    capsys.readouterr()  # the run's summary JSON
    assert main(["train", *base, "--strategy", "openai_es", "--out", str(tmp_path / "b"), "--print-config"]) == 0
    (tmp_path / "b.yaml").write_text(capsys.readouterr().out.replace("out: null", f"out: {tmp_path / 'b'}"))
    with pytest.raises(SystemExit):  # the YAML names another run directory
        main(["train", "--resume", str(tmp_path / "a"), "--config", str(tmp_path / "b.yaml"), "--print-config"])
    assert "the options name out" in capsys.readouterr().err
    # values equal to a default still count: sigma_schedule constant replaces the run's linear schedule
    (tmp_path / "c.yaml").write_text("sigma_schedule: constant\nlr: 1e-3\n")
    assert main(["train", "--resume", str(tmp_path / "a"), "--config", str(tmp_path / "c.yaml"), "--steps", "3",
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "sigma_schedule: constant" in printed and "lr: 0.001" in printed


def test_a_printed_config_of_another_strategy_runs_with_a_new_task(tmp_path, capsys):
    assert main(["train", "--task", "cartpole", "--print-config"]) == 0  # pgpe, weight_decay 0.0
    (tmp_path / "cp.yaml").write_text(capsys.readouterr().out)
    assert main(["train", "--config", str(tmp_path / "cp.yaml"), "--task", "digits", "--print-config"]) == 0


@pytest.mark.parametrize("args, message", [
    (["--strategy", "backprop", "--layer", "lowrank"], "option 'layer' (= 'lowrank') applies to the ES strategies"),
    (["--strategy", "backprop", "--population", "512"], "option 'population' (= 512) applies to the ES"),
    (["--optimizer", "adamw"], "option 'optimizer' (= 'adamw') applies to strategy 'backprop', not to strategy 'openai_es' (the task's default)"),
    (["--strategy", "pgpe", "--accumulate", "1"], "option 'accumulate' (= 1) applies to strategy 'backprop', not "
                                                  "to strategy 'pgpe'"),
])
def test_the_cli_refuses_the_other_sides_options_even_at_their_defaults(args, message, capsys):
    from nesgpu.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", *args, "--print-config"])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_config_file_of_the_other_side_is_refused_away_from_the_defaults(tmp_path, capsys):
    from nesgpu.cli import main

    (tmp_path / "bp.yaml").write_text("strategy: backprop\nsigma: 0.3\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(tmp_path / "bp.yaml"), "--print-config"])
    assert "option 'sigma' (= 0.3) applies to the ES strategies" in capsys.readouterr().err


def test_an_es_runs_config_records_no_backprop_optimizer(tmp_path):
    import json

    from nesgpu.train import train
    from nesgpu.train.storage.checkpoint import find_checkpoint

    out = tmp_path / "r"
    cfg = dict(task="digits", population=8, hidden=(4,), steps=2, out=str(out))
    train(TrainConfig.flat(**cfg), log=lambda *a, **k: None)
    assert "optimizer" not in json.loads((out / "config.json").read_text())
    assert TrainConfig(task="digits", strategy="backprop").resolved().option("optimizer") == "adamw"
    # a run an earlier nesgpu wrote recorded backprop's "adamw": it still resumes and loads
    state_path = find_checkpoint(out / "checkpoint") / "state.pt"
    state = torch.load(state_path, weights_only=True)
    state["config"]["optimizer"] = "adamw"
    torch.save(state, state_path)
    summary = train(TrainConfig.flat(**{**cfg, "steps": 3}), resume=True, log=lambda *a, **k: None)
    assert summary["steps"] == 3


def test_a_config_file_may_group_each_components_options(tmp_path):
    flat, grouped = tmp_path / "flat.yaml", tmp_path / "grouped.yaml"
    flat.write_text("task: cartpole\nstrategy: ars\ntop_b: 2\nepisodes: 3\nreward_shift: 1e-3\n")
    grouped.write_text("task: cartpole\nstrategy: ars\nstrategy_options:\n  top_b: 2\ntask_options:\n  episodes: 3\n"
                       "  reward_shift: 1e-3\n")  # YAML 1.1 reads 1e-3 as text: a float option's is a float
    assert TrainConfig.from_yaml(grouped).resolved() == TrainConfig.from_yaml(flat).resolved()
    assert TrainConfig.from_yaml(grouped).resolved().task_options.reward_shift == 0.001
    for text, message in [("strategy_options:\n  episodes: 2\n", "strategy_options names 'episodes', which is no "
                                                                  "strategy's option"),
                          ("task_options: 3\n", "task_options must be a mapping of the task's options; got 3"),
                          ("episodes: 2\ntask_options:\n  episodes: 3\n", "option 'episodes' is given twice")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text("task: cartpole\n" + text)
        with pytest.raises(ValueError, match=message):
            TrainConfig.from_yaml(bad)
    assert TrainConfig.from_dict({"task": "cartpole", "task_options": {"episodes": 3}}).task_options == {"episodes": 3}
