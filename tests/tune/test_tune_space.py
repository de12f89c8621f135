"""Search spaces of nesgpu tune: the format, every refusal with a message naming the option, the defaults,
and the command line's one-line errors."""

import dataclasses
import subprocess
import sys

import pytest
import yaml

from nesgpu.cli import main
from nesgpu.train import TrainConfig
from nesgpu.tune.space import DEFAULT_SPACES, default_space, make_space, parse_hidden, parse_space, read_space

BASE = TrainConfig.flat(task="digits", steps=6, population=16, batch_size=8, hidden=(8,), log="none", device="cpu")


def test_a_space_parses_into_floats_ints_and_choices():
    space = parse_space({"lr": {"low": 1e-4, "high": 0.1, "log": True},
                         "population": {"low": 8, "high": 32, "step": 8},
                         "sigma": {"low": "1e-2", "high": 0.5},  # YAML 1.1 reads 1e-2 as a string
                         "hidden": {"choices": ["8", 16, [8, 8], "0"]},
                         "rank": {"low": 1, "high": 4}}, BASE)
    kinds = {p.name: p.kind for p in space.params}
    assert kinds == {"lr": "float", "population": "int", "sigma": "float", "hidden": "categorical", "rank": "int"}
    assert space.params[2].low == 0.01
    assert space.params[3].choices == ("8", "16", "8,8", "0")
    cfg = space.apply(BASE, {"lr": 0.01, "population": 24, "sigma": 0.2, "hidden": "8,8", "rank": 3})
    assert (cfg.lr, cfg.population, cfg.hidden, cfg.layer_options) == (0.01, 24, (8, 8), {"rank": 3})
    assert space.apply(BASE, {"hidden": "0"}).hidden == ()
    # the mapping round-trips through to_dict (what --print-space writes and the study stores)
    assert parse_space(space.to_dict(), BASE) == space


def test_a_space_file_is_read(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("lr: {low: 1e-4, high: 0.1, log: true}\nhidden: {choices: ['8', '8,8']}\n")
    space = make_space(BASE, path)
    assert space.names == ["lr", "hidden"] and space.params[0].low == 1e-4
    path.write_text("- lr\n")
    with pytest.raises(ValueError, match="expected a mapping of option names"):
        read_space(path)
    with pytest.raises(ValueError, match="cannot read the space file"):
        read_space(tmp_path / "missing.yaml")


@pytest.mark.parametrize("space, message", [
    ({"lrr": {"low": 0.1, "high": 1.0}}, r"'lrr': unknown option.*did you mean 'lr'"),
    ({"lr": {"low": 0.1, "high": 0.1}}, r"'lr': expected low < high; got low 0.1 and high 0.1 \(an empty range\)"),
    ({"lr": {"low": 0.2, "high": 0.1}}, r"'lr': expected low < high.*\(a reversed range\)"),
    ({"weight_decay": {"low": 0.0, "high": 0.1, "log": True}},
     r"'weight_decay': a log range needs low > 0; got low 0.0"),
    ({"hidden": {"choices": []}}, r"'hidden': expected a non-empty list of choices"),
    ({"shaping": {"choices": ["raw", "raw"]}}, r"'shaping': choices must be distinct"),
    ({"top_b": {"low": 1, "high": 4}}, r"'top_b' applies to strategy 'ars', not to the base config's 'openai_es'"),
    ({"optimizer": {"choices": ["adamw", "sgd"]}}, r"'optimizer' applies to strategy 'backprop'"),
    ({"k": {"low": 1, "high": 4}},
     r"'k' is an option of layer kind\(s\) \['sparse'\], not of the base config's layer 'lowrank'"),
    ({"population": {"low": 8, "high": 32}},
     r"'population': the value 9 is refused by the config: population must be even"),
    ({"sigma": {"low": -1.0, "high": 1.0}}, r"'sigma': the value -1.0 is refused.*sigma must be a positive"),
    ({"population": {"low": 8.0, "high": 32}}, r"'population': the value 8.0 is refused.*must be int"),
    ({"shaping": {"choices": ["ranks"]}}, r"'shaping': the value 'ranks' is refused.*shaping'? must be one of"),
    ({"hidden": {"choices": ["8,x"]}}, r"'hidden': expected hidden sizes like"),
    ({"lr": {"low": 0.1}}, r"'lr': expected \{low: L, high: H.*got keys \['low'\]"),
    ({"lr": {"low": 0.1, "high": 1.0, "scale": "log"}}, r"'lr': expected \{low: L.*got keys"),
    ({"lr": {"low": 0.1, "high": 1.0, "log": "yes"}}, r"'lr': log must be true or false"),
    ({"lr": {"low": 0.1, "high": 1.0, "log": True, "step": 0.1}}, r"'lr': a log range takes no step"),
    ({"lr": {"low": 0.1, "high": 1.0, "step": 0.4}}, r"'lr': high - low must be a multiple of step"),
    ({"lr": {"low": "small", "high": 1.0}}, r"'lr': low must be a number; got 'small'"),
    ({"lr": [0.1, 1.0]}, r"'lr': expected \{low: L, high: H"),
    ({"lr": {"choices": [0.1], "low": 0.1}}, r"'lr': choices go alone"),
    ({"out": {"choices": ["a", "b"]}}, r"'out' cannot be searched: each trial runs in DIR/trials/NNNN"),
    ({"layer_options": {"choices": [{}]}}, r"'layer_options' cannot be searched: search a layer option by its own"),
    ({}, r"expected a non-empty mapping"),
])
def test_each_bad_space_is_refused_naming_the_option(space, message):
    with pytest.raises(ValueError, match=message):
        parse_space(space, BASE)


def test_options_must_fit_the_strategy_and_the_layer():
    ars = dataclasses.replace(BASE, strategy="ars")
    assert parse_space({"top_b": {"low": 1, "high": 8}}, ars).names == ["top_b"]
    with pytest.raises(ValueError, match=r"'weight_decay' applies to strategy 'openai_es' or 'backprop', not to the base "
                                         r"config's 'ars'"):
        parse_space({"weight_decay": {"low": 0.0, "high": 0.1}}, ars)
    sparse = dataclasses.replace(BASE, layer="sparse")
    assert parse_space({"k": {"low": 1, "high": 4}}, sparse).names == ["k"]
    with pytest.raises(ValueError, match=r"'rank' is an option of layer kind\(s\) \['lowrank'\]"):
        parse_space({"rank": {"low": 1, "high": 4}}, sparse)
    backprop = dataclasses.replace(BASE, strategy="backprop", population=None)
    with pytest.raises(ValueError, match=r"'sigma' applies to the ES strategies, not to strategy 'backprop'"):
        parse_space({"sigma": {"low": 0.01, "high": 0.1}}, backprop)
    with pytest.raises(ValueError, match=r"'rank' is an option of layer kind 'lowrank', which strategy 'backprop'"):
        parse_space({"rank": {"low": 1, "high": 4}}, backprop)


def test_a_space_addresses_the_tasks_options_by_name():
    cartpole = TrainConfig(task="cartpole", steps=2)
    space = parse_space({"episodes": {"low": 1, "high": 4}, "start_states": {"choices": ["shared", "independent"]}},
                        cartpole)
    trial = space.apply(cartpole, {"episodes": 3, "start_states": "independent"}).resolved()
    assert (trial.task_options.episodes, trial.task_options.start_states) == (3, "independent")
    with pytest.raises(ValueError, match=r"'batch_size'.*applies to task 'digits' or .*not to task 'cartpole'"):
        parse_space({"batch_size": {"choices": [8, 16]}}, cartpole)


def test_hidden_sizes_parse_from_strings_numbers_and_lists():
    assert parse_hidden("64,32") == (64, 32)
    assert parse_hidden(64) == (64,)
    assert parse_hidden([64, 64]) == (64, 64)
    assert parse_hidden("0") == parse_hidden([]) == parse_hidden("") == ()
    for bad in ("64,-1", [1.5], True, {"a": 1}):
        with pytest.raises(ValueError, match="hidden"):
            parse_hidden(bad)


@pytest.mark.parametrize("cfg", [
    BASE,
    TrainConfig(task="cartpole"),
    TrainConfig(task="cartpole", strategy="ars", layer="gaussian"),
    TrainConfig(task="reverse"),
    TrainConfig(task="mnist1d", model="cnn"),
    TrainConfig(task="digits", strategy="backprop"),
])
def test_default_spaces_pass_their_own_checks_and_sit_around_the_presets(cfg):
    space = default_space(cfg)
    resolved = cfg.resolved()
    specs = space.to_dict()
    assert set(space.names) <= set(DEFAULT_SPACES[resolved.strategy])
    assert specs["lr"] == {"low": resolved.lr / 10, "high": resolved.lr * 10, "log": True}
    if resolved.strategy == "backprop":
        assert set(space.names) == {"lr", "weight_decay", "batch_size"}
        return
    assert specs["sigma"] == {"low": resolved.sigma / 10, "high": resolved.sigma * 10, "log": True}
    assert specs["population"]["low"] <= resolved.population <= specs["population"]["high"]
    assert ("weight_decay" in space.names) == (resolved.strategy == "openai_es")
    assert ("rank" in space.names) == (resolved.layer == "lowrank")
    assert ("hidden" in space.names) == (resolved.model == "mlp")


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code, capsys.readouterr()


@pytest.mark.parametrize("text, message", [
    ("lr: {low: 0.1, high: 0.01}", "'lr': expected low < high"),
    ("top_b: {low: 1, high: 4}", "'top_b' applies to strategy 'ars'"),
    ("rank: {choices: []}", "'rank': expected a non-empty list of choices"),
    ("lr: [", "is not valid YAML"),
])
def test_the_command_line_refuses_a_bad_space_in_one_line(tmp_path, capsys, text, message):
    space = tmp_path / "space.yaml"
    space.write_text(text)
    code, output = run_cli(["tune", "--task", "digits", "--trials", "2", "--out", str(tmp_path / "tune"),
                            "--space", str(space)], capsys)
    assert code == 2
    lines = output.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nesgpu tune: error: ") and message in lines[0]
    assert not (tmp_path / "tune").exists()  # nothing was started


@pytest.mark.parametrize("argv, message", [
    (["--trials", "2"], "--out DIR is required"),
    (["--out", "X"], "give --trials N, --timeout S, or both"),
    (["--out", "X", "--trials", "0"], "trials must be a whole number >= 1; got 0"),
    (["--out", "X", "--trials", "2", "--lr", "-1"], "lr must be a positive finite number"),
    (["--out", "X", "--trials", "2", "--heartbeat", "0"], "heartbeat must be a whole number of seconds >= 1"),
])
def test_the_command_line_refuses_bad_options_in_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, output = run_cli(["tune", "--task", "digits", *argv], capsys)
    assert code == 2
    lines = output.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nesgpu tune: error: ") and message in lines[0]
    assert not (tmp_path / "X").exists()  # refused before the tune directory was made


def test_print_space_writes_the_default_space_as_yaml_that_reads_back(tmp_path, capsys):
    assert main(["tune", "--task", "cartpole", "--print-space"]) == 0
    text = capsys.readouterr().out
    values = yaml.safe_load(text)
    assert set(values) == {"lr", "sigma", "population", "rank", "hidden"}
    (tmp_path / "space.yaml").write_text(text)
    cartpole = TrainConfig(task="cartpole")
    assert make_space(cartpole, tmp_path / "space.yaml") == default_space(cartpole)


def test_the_commands_choices_are_the_apis():
    from nesgpu.tune import PRUNERS, SAMPLERS
    from nesgpu.tune.cli import PRUNER_CHOICES, SAMPLER_CHOICES

    assert (SAMPLER_CHOICES, PRUNER_CHOICES) == (SAMPLERS, PRUNERS)


def test_the_tune_help_lists_its_options_and_the_train_options(capsys):
    code, output = run_cli(["tune", "--help"], capsys)
    assert code == 0
    for flag in ("--trials", "--timeout", "--space", "--sampler", "--pruner", "--study-name", "--out DIR", "--lr",
                 "--rank", "--config"):
        assert flag in output.out
    assert "tune directory" in output.out and "run directory" not in output.out


def test_without_optuna_nesgpu_loads_and_tune_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['optuna'] = None\n"
            "from nesgpu.cli import main\n"
            "main(['tune', '--task', 'digits', '--print-space'])\n"  # the space needs no Optuna
            "main(['tune', '--task', 'digits', '--trials', '1', '--out', 'never'])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            check=False)
    assert result.returncode == 2
    assert "lr:" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("nesgpu tune: error: nesgpu tune needs Optuna")
    assert "pip install 'nesgpu[tune]'" in result.stderr


def test_an_auto_sigma_and_lr_are_searched_over_the_probes_range():
    from nesgpu.probe import GRID

    specs = default_space(TrainConfig(sigma="auto", lr="auto")).to_dict()
    assert specs["sigma"] == {"low": GRID[0], "high": GRID[-1], "log": True}
    assert specs["lr"] == {"low": 1e-5, "high": 0.1, "log": True}


def test_a_strategy_with_a_parameter_limit_searches_only_models_within_it():
    """xnes takes up to 2,000 evolving parameters: digits' default mlp (64 hidden) exceeds it, so every trial of
    the default space would be refused; it is refused once, up front, and a base that fits searches only the
    hidden sizes that fit."""
    with pytest.raises(ValueError, match="strategy 'xnes' takes models of up to 2,000 evolving parameters; the "
                                         "base config's has 4,810, so every trial would be refused"):
        default_space(TrainConfig(task="digits", strategy="xnes"))
    space = default_space(TrainConfig(task="digits", strategy="xnes", hidden=(16,)))
    assert space.to_dict()["hidden"]["choices"] == ["8", "16", "16,16"]  # 32 (2,410) is left out
