"""nesgpu compare and the time budget it relies on."""

import csv

import pytest

from nesgpu.frontends.compare import compare, run_configs
from nesgpu.train import TrainConfig
from nesgpu.train.trainer import train

QUIET = dict(log=lambda *a, **k: None)


def test_time_budget_stops_a_run_and_evaluates_by_seconds(tmp_path):
    cfg = TrainConfig(task="digits", strategy="backprop", hidden=(8,), steps=10_000_000, time_budget=1.0,
                      eval_every=10_000_000, eval_seconds=0.25, out=str(tmp_path / "r"), log="none")
    summary = train(cfg, **QUIET)
    assert 1.0 <= summary["seconds"] < 3.0 and 1 < summary["steps"] < 10_000_000
    with open(tmp_path / "r" / "metrics.csv") as f:
        evaluated = [float(r["seconds"]) for r in csv.DictReader(f) if r.get("test_accuracy")]
    assert 3 <= len(evaluated) <= 6  # every quarter second, and at the end
    assert (tmp_path / "r" / "model.safetensors").exists()


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf")])
def test_time_budget_must_be_positive_and_finite(value):
    with pytest.raises(ValueError, match="time_budget must be"):
        TrainConfig(task="digits", time_budget=value).resolved()


def test_compare_writes_table_plot_and_runs(tmp_path):
    result = compare("digits", budget=1.5, seeds=[0, 1], out=tmp_path / "c", shared={"hidden": (8,)},
                     es={"population": 32}, evals=3, **QUIET)
    runs = result["runs"]
    assert [(r["strategy"], r["seed"]) for r in runs] == [("openai_es", 0), ("backprop", 0), ("openai_es", 1),
                                                            ("backprop", 1)]
    for r in runs:
        assert r["seconds"] >= 1.5 and r["curve"] and r["curve"][-1][2] == pytest.approx(r["value"], abs=1e-5)
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| openai_es | 2 |" in table and "| backprop | 2 |" in table
    assert (tmp_path / "c" / "compare.png").stat().st_size > 0
    assert (tmp_path / "c" / "backprop-seed1" / "model.safetensors").exists()
    # the same model on both sides: the ES run's model is the perturbed conversion of the same initial weights
    es_cfg = TrainConfig.from_dict(__import__("json").loads((tmp_path / "c" / "openai_es-seed0" / "config.json")
                                                            .read_text()))
    assert es_cfg.hidden == (8,) and es_cfg.seed == 0


@pytest.mark.parametrize("kw, message", [
    (dict(task="cartpole"), "supervised tasks"),
    (dict(budget=0), "budget must be"),
    (dict(seeds=[0, 0]), "seeds must be distinct"),
    (dict(es={"seed": 3}), "compare sets itself"),
    (dict(backprop={"time_budget": 3}), "compare sets itself"),
    (dict(es={"strategy": "backprop"}), "expected an ES strategy"),
    (dict(backprop={"sigma": 0.2}), "applies to the ES strategies"),
    (dict(es={"hidden": (8,)}), r"the es config sets \['hidden'\]: both sides of a comparison train the same"),
    (dict(backprop={"model": "cnn", "init": "he"}), r"the backprop config sets \['model', 'init'\]"),
    (dict(a={"strategy": "snes"}), r"takes both a and b \(--a and --b\); got only a"),
    (dict(a={}, b={}, es={"population": 8}), "in place of es and backprop"),
    (dict(a={"seed": 1}, b={}), r"the a config sets \['seed'\], which compare sets itself"),
    (dict(a={}, b={"hidden": (8,)}), r"the b config sets \['hidden'\]: both sides"),
    (dict(task="cartpole"), r"has no differentiable loss\. Compare two configurations of it instead: nesgpu "
                            r"compare --task cartpole --a '--strategy snes' --b '--strategy openai_es'"),
])
def test_compare_bad_input_fails_before_any_run(tmp_path, kw, message):
    args = dict(task="digits", budget=1.0, seeds=[0], out=tmp_path / "c")
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        run_configs(**args)


def test_compare_cli_bad_input_is_one_line(tmp_path, capsys):
    from nesgpu.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--task", "cartpole", "--out", str(tmp_path / "c")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "supervised tasks" in err[0]
    assert not (tmp_path / "c").exists()


def test_compare_refuses_the_runs_of_an_earlier_compare(tmp_path):
    compare("digits", budget=0.3, seeds=[0], out=tmp_path / "c", shared={"hidden": (4,)}, es={"population": 8},
            evals=1, **QUIET)
    with pytest.raises(ValueError, match="pass --overwrite"):
        compare("digits", budget=0.3, seeds=[0], out=tmp_path / "c", **QUIET)
    compare("digits", budget=0.3, seeds=[0], out=tmp_path / "c", shared={"hidden": (4,)}, es={"population": 8},
            evals=1, overwrite=True, **QUIET)


def test_compare_cli_refuses_an_es_config_with_its_own_model(tmp_path, capsys):
    from nesgpu.cli import main

    (tmp_path / "es.yaml").write_text("hidden: [8]\npopulation: 32\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--es-config", str(tmp_path / "es.yaml"), "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "give it once for both (compare's --model/--hidden" in err[0]
    assert not (tmp_path / "c").exists()


def test_an_interrupted_compare_says_to_run_it_again_not_to_resume(tmp_path, monkeypatch):
    from nesgpu.train import trainer

    def stopped(cfg, **kwargs):
        raise trainer.Interrupted(cfg.out, 7)
    monkeypatch.setattr(trainer, "train", stopped)
    with pytest.raises(trainer.Interrupted) as info:
        compare("digits", budget=1.0, seeds=[0], out=tmp_path / "c", **QUIET)
    assert "openai_es run of seed 0 stopped at step 7; a comparison cannot be resumed" in str(info.value)
    assert "--resume" not in str(info.value) and "run compare again with --overwrite" in str(info.value)


def test_compare_shows_each_runs_evaluations_as_they_come(tmp_path):
    lines = []
    compare("digits", budget=0.6, seeds=[0], out=tmp_path / "c", shared={"hidden": (4,)}, es={"population": 8},
            evals=2, log=lines.append)
    shown = [line for line in lines if line.startswith("  ")]
    assert any(line.startswith("  openai_es seed 0: ") and "of 0.6 s, step" in line and "test_accuracy" in line
               for line in shown)
    assert any(line.startswith("  backprop seed 0: ") for line in shown)


def test_summary_seconds_count_the_final_evaluation(tmp_path):
    lines = []
    summary = train(TrainConfig(task="digits", population=8, hidden=(4,), steps=2, out=str(tmp_path / "r")),
                    log=lines.append)
    assert summary["seconds"] >= summary["final_evaluation_seconds"] >= 0  # rounded to ms: a fast one is 0
    assert "final evaluation of the model after step 2 (test_accuracy)" in lines
    assert "s of final evaluation) ->" in lines[-1]


def test_compare_takes_trains_own_name_for_the_budget(tmp_path):
    from nesgpu.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["compare", "--time-budget", "5"]).budget == 5.0
    assert parser.parse_args(["compare", "--budget", "7"]).budget == 7.0


def test_summary_records_population_and_directions(tmp_path):
    summary = train(TrainConfig(task="digits", population=8, hidden=(4,), steps=1, out=str(tmp_path / "a")), **QUIET)
    assert (summary["population"], summary["directions"]) == (8, 4)
    summary = train(TrainConfig(task="digits", population=8, hidden=(4,), steps=1, antithetic=False,
                                out=str(tmp_path / "b")), **QUIET)
    assert (summary["population"], summary["directions"]) == (8, 8)


def test_compare_two_strategies_on_an_rl_task_scores_both_by_its_evaluation(tmp_path):
    lines = []
    result = compare("cartpole", budget=0.4, seeds=[0], out=tmp_path / "c", evals=1, log=lines.append,
                     a={"strategy": "snes", "population": 8}, b={"strategy": "openai_es", "population": 8})
    runs = result["runs"]
    assert [(r["label"], r["strategy"], r["metric"]) for r in runs] == [("snes", "snes", "eval_return"),
                                                                         ("openai_es", "openai_es", "eval_return")]
    assert all(r["curve"] and r["curve"][-1][2] == pytest.approx(r["value"]) for r in runs)
    assert all(r["curve"][-1][1] > 0 for r in runs)  # an RL run's samples: its environment steps
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| snes | 1 |" in table and "| openai_es | 1 |" in table and "final eval_return" in table
    assert "- snes: population=8" in table
    assert (tmp_path / "c" / "snes-seed0" / "model.safetensors").exists()
    assert not any("| snes |" in line for line in lines)  # the table is returned, not printed (twice)


def test_two_configurations_of_one_strategy_are_labelled_a_and_b(tmp_path):
    configs = run_configs("cartpole", 1.0, [0, 1], tmp_path / "c", a={"population": 8}, b={"population": 32})
    assert [c.out for c in configs] == [str(tmp_path / "c" / f"pgpe-{side}-seed{seed}")
                                        for seed in (0, 1) for side in "ab"]
    assert [c.population for c in configs] == [8, 32, 8, 32] and {c.task for c in configs} == {"cartpole"}


def test_compare_cli_takes_two_configurations_as_train_flags_and_prints_the_table_once(tmp_path, capsys):
    from nesgpu.cli import main

    assert main(["compare", "--task", "cartpole", "--a", "--strategy snes --population 8", "--b",
                 "--strategy openai_es --population 8 --sigma 0.1", "--time-budget", "0.3", "--evals", "1",
                 "--out", str(tmp_path / "c")]) == 0
    out, err = capsys.readouterr()
    assert out.count("| snes | 1 |") == 1 and out.count("| openai_es | 1 |") == 1 and "| snes |" not in err
    assert "- openai_es: population=8, sigma=0.1" in out
    assert out == (tmp_path / "c" / "compare.md").read_text()


@pytest.mark.parametrize("a, message", [
    ("--strategy snes --bogus 3", r"--a '--strategy snes --bogus 3': unrecognized arguments: --bogus 3"),
    ("--population x", "argument --population: invalid int value: 'x'"),
    ("--seed 3", r"the a config sets \['seed'\], which compare sets itself"),
])
def test_compare_cli_bad_configuration_is_one_line(tmp_path, capsys, a, message):
    import re

    from nesgpu.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--task", "cartpole", "--a", a, "--b", "--strategy openai_es", "--out", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and re.search(message, err[0]), err
    assert not (tmp_path / "c").exists()


def test_a_side_can_be_a_yaml_file_with_layer_options(tmp_path):
    from nesgpu.frontends.compare import side_options

    (tmp_path / "a.yaml").write_text("strategy: snes\npopulation: 8\n")
    assert side_options(str(tmp_path / "a.yaml"), "cartpole") == {"strategy": "snes", "population": 8}
    assert side_options("--layer lowrank --rank 2 --lr 0.1", "digits") == {"layer": "lowrank", "lr": 0.1,
                                                                           "layer_options": {"rank": 2}}
