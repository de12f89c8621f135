"""nesgpu tune end to end on tiny digits runs: it beats a bad start, writes its files, resumes, survives a
killed process's trial, records failures, stops cleanly on Ctrl-C, and prunes."""

import csv
import dataclasses
import json
import math
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from nesgpu.cli import main
from nesgpu.train import Interrupted, TrainConfig, train
from nesgpu.tune import study as study_module
from nesgpu.tune import tune
from nesgpu.tune.outputs import PLOTS, best_config
from nesgpu.tune.storage import open_storage, quiet_optuna, trial_id
from nesgpu.tune.study import PruningCallback, make_pruner

FAST = dict(task="digits", steps=6, population=16, batch_size=8, hidden=(8,), log="none", device="cpu")
LR = {"lr": {"low": 1e-5, "high": 0.3, "log": True}}
FAST_FLAGS = ["--task", "digits", "--steps", "6", "--population", "16", "--batch-size", "8", "--hidden", "8",
              "--log", "none", "--device", "cpu"]


def quiet(*args, **kwargs):
    pass


def states(study):
    return [t.state for t in study.trials]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A deliberately bad start (lr 1e-5 learns nothing in 20 steps), its value, and a tune of its lr."""
    root = tmp_path_factory.mktemp("tuned")
    base = TrainConfig.flat(**{**FAST, "steps": 20, "population": 32, "batch_size": 16, "hidden": (16,)}, lr=1e-5)
    bad = train(dataclasses.replace(base, out=str(root / "bad")), log=quiet)["value"]
    lines = []
    study = tune(base, LR, trials=6, out=root / "tune", pruner="none", log=lines.append)
    return base, bad, study, root / "tune", lines


def test_a_tune_finds_a_better_config_than_a_bad_start(tuned):
    _, bad, study, out, lines = tuned
    assert states(study) == [TrialState.COMPLETE] * 6
    # the same seed, the same steps: only the searched lr differs, and it is much better
    assert study.best_value > bad + 0.1
    assert study.best_params["lr"] > 1e-3
    # one line per trial, naming its value, options and run directory
    assert len(lines) == 6 and all(line.startswith(f"trial {i} test_accuracy ") for i, line in enumerate(lines))
    assert f"-> {out / 'trials' / '0003'}" in lines[3]


def test_each_trial_is_a_run_directory_named_by_its_number(tuned):
    _, _, study, out, _ = tuned
    for t in study.trials:
        run = out / "trials" / f"{t.number:04d}"
        assert t.user_attrs["run_dir"] == str(run)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["value"] == t.value and t.user_attrs["metric"] == summary["metric"] == "test_accuracy"
        assert json.loads((run / "config.json").read_text())["lr"] == t.params["lr"]


def test_trials_csv_and_the_plots_are_written(tuned):
    _, _, study, out, _ = tuned
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [int(r["number"]) for r in rows] == list(range(6))
    assert {r["state"] for r in rows} == {"COMPLETE"}
    assert [float(r["value"]) for r in rows] == [t.value for t in study.trials]
    assert [float(r["params_lr"]) for r in rows] == [t.params["lr"] for t in study.trials]
    assert rows[0]["user_attrs_run_dir"].endswith("0000")
    for name in PLOTS.values():
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_best_yaml_is_the_best_trials_full_config_and_trains_as_is(tuned, tmp_path, capsys):
    base, _, study, out, _ = tuned
    text = (out / "best.yaml").read_text()
    assert "out" not in yaml.safe_load(text)
    cfg = TrainConfig.from_yaml(out / "best.yaml")
    resolved = cfg.resolved()
    assert resolved == cfg  # already complete
    run_config = json.loads((out / "trials" / f"{study.best_trial.number:04d}" / "config.json").read_text())
    run_config["out"] = None
    assert resolved.to_dict() == {**run_config, "hidden": tuple(run_config["hidden"])}
    assert resolved == best_config(study, base, tune_space(base))
    assert main(["train", "--config", str(out / "best.yaml"), "--out", str(tmp_path / "again")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["value"] == pytest.approx(study.best_value)  # the same run again, bit for bit on a CPU


def tune_space(base):
    from nesgpu.tune.space import make_space

    return make_space(base, LR)


def test_a_second_call_continues_the_study_up_to_the_new_cap(tmp_path):
    base = TrainConfig.flat(**FAST)
    first = tune(base, LR, trials=2, out=tmp_path, log=quiet, plots=False)
    before = [(t.number, t.params, t.value) for t in first.trials]
    again = tune(base, LR, trials=2, out=tmp_path, log=quiet, plots=False)
    assert len(again.trials) == 2  # the cap was reached: no new trial
    study = tune(base, LR, trials=4, out=tmp_path, log=quiet, plots=False)
    assert states(study) == [TrialState.COMPLETE] * 4
    assert [(t.number, t.params, t.value) for t in study.trials[:2]] == before
    # the continued study draws what one call of 4 trials draws (seeded by the trial number)
    straight = tune(base, LR, trials=4, out=tmp_path / "straight", log=quiet, plots=False)
    assert [t.params for t in straight.trials] == [t.params for t in study.trials]


def test_a_study_of_another_base_config_or_space_is_refused(tmp_path):
    base = TrainConfig.flat(**FAST)
    tune(base, LR, trials=1, out=tmp_path, log=quiet, plots=False)
    with pytest.raises(ValueError, match=r"holds a study with another base config \(steps: 6 there, 7 here\)"):
        tune(dataclasses.replace(base, steps=7), LR, trials=2, out=tmp_path, log=quiet)
    with pytest.raises(ValueError, match=r"holds a study with another search space"):
        tune(base, {"lr": {"low": 1e-4, "high": 0.3, "log": True}}, trials=2, out=tmp_path, log=quiet)
    with pytest.raises(ValueError, match=r"holds study '.*', not 'other'; a directory holds one study"):
        tune(base, LR, trials=2, out=tmp_path, study_name="other", log=quiet)
    # options that do not change what a trial computes may differ
    tune(dataclasses.replace(base, progress_every=0.0, device="auto"), LR, trials=2, out=tmp_path, log=quiet,
         plots=False)


def test_run_directories_left_without_their_study_are_not_overwritten(tmp_path):
    (tmp_path / "trials" / "0000").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"trials holds run directories \(0000\) of a study that is no longer"):
        tune(TrainConfig.flat(**FAST), LR, trials=1, out=tmp_path, log=quiet)


def test_a_killed_processs_running_trial_is_marked_failed_and_does_not_block(tmp_path):
    base = TrainConfig.flat(**FAST)
    tune(base, LR, trials=1, out=tmp_path, heartbeat=1, log=quiet, plots=False)
    # a process that started trial 1 and was killed: RUNNING, with a heartbeat that is never renewed
    storage = open_storage(tmp_path, heartbeat=1)
    with quiet_optuna():
        killed = optuna.load_study(study_name=tmp_path.name, storage=storage).ask()
    storage.record_heartbeat(trial_id(storage, killed.study, killed.number))
    lines = []
    study = tune(base, LR, trials=2, out=tmp_path, heartbeat=1, log=lines.append, plots=False)
    assert states(study) == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert lines[0].startswith("waiting for 1 trial(s) running in other processes")
    assert lines[1] == "trial 1 had no heartbeat for 3 s (its process was killed): marked failed"


def test_a_failing_trial_is_recorded_with_its_message_and_the_study_goes_on(tmp_path, monkeypatch):
    calls = []

    def diverge_once(cfg, **kwargs):
        calls.append(cfg.out)
        if len(calls) == 1:
            raise ValueError("step 3 made non-finite values in ['0.weight']")
        return train(cfg, **kwargs)

    monkeypatch.setattr(study_module, "train", diverge_once)
    lines = []
    study = tune(TrainConfig.flat(**FAST), LR, trials=2, out=tmp_path, log=lines.append, plots=False)
    assert states(study) == [TrialState.FAIL, TrialState.COMPLETE]  # the failed trial counts toward the cap
    assert study.trials[0].user_attrs["error"] == "step 3 made non-finite values in ['0.weight']"
    assert lines[0].startswith("trial 0 failed: step 3 made non-finite values")
    rows = list(csv.DictReader((tmp_path / "trials.csv").open()))
    assert rows[0]["state"] == "FAIL" and "non-finite" in rows[0]["user_attrs_error"]


def test_a_study_whose_trials_all_fail_stops_at_the_cap_with_one_line(tmp_path, capsys, monkeypatch):
    """Every trial diverges: the failures count toward --trials and the tune ends with an error (it used to
    start trial after trial without end). (lr 1e30 no longer diverges: after its first step every member of
    the saturated net ties, and steps without signal move nothing.)"""
    def diverge(cfg, **kwargs):
        raise ValueError("step 2 made non-finite values in ['1.weight']")

    monkeypatch.setattr(study_module, "train", diverge)
    argv = ["tune", *FAST_FLAGS, "--trials", "2", "--pruner", "none", "--out", str(tmp_path / "t")]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nesgpu tune: error: every trial failed (2); the last: ")
    assert "Fix the base config" in err[-1]
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't' / 'study.db'}")
    assert states(study) == [TrialState.FAIL, TrialState.FAIL]


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), Interrupted(Path("x"), 3)])
def test_ctrl_c_fails_the_running_trial_and_exits_130_resumably(tmp_path, monkeypatch, capsys, stop):
    def interrupted_at_trial_1(cfg, **kwargs):
        if cfg.out.endswith("0001"):
            raise stop
        return train(cfg, **kwargs)

    monkeypatch.setattr(study_module, "train", interrupted_at_trial_1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(LR))
    argv = ["tune", *FAST_FLAGS, "--trials", "2", "--out", str(tmp_path / "t"), "--space", str(tmp_path / "space.yaml")]
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nesgpu tune: interrupted; the study in ") and "run the same command" in err[-1]
    rows = list(csv.DictReader((tmp_path / "t" / "trials.csv").open()))
    assert [r["state"] for r in rows] == ["COMPLETE", "FAIL"]
    monkeypatch.setattr(study_module, "train", train)
    assert main(argv) == 0
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't' / 'study.db'}")
    assert states(study) == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert study.trials[1].user_attrs["error"] == ("interrupted at step 3" if isinstance(stop, Interrupted)
                                                   else "interrupted")
    out = capsys.readouterr().out
    assert "best: test_accuracy = " in out and "best.yaml" in out


class FakeTrial:
    """What PruningCallback uses of an Optuna trial: report and should_prune."""

    def __init__(self, prune_below):
        self.reports, self.prune_below = [], prune_below

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return self.reports[-1][1] < self.prune_below


def test_the_pruning_callback_reports_evaluations_and_prunes_when_told():
    trial = FakeTrial(prune_below=0.5)
    callback = PruningCallback(trial, last_step=10)
    assert callback(1, {"step": 1, "fitness_mean": -2.0}) is False  # no evaluation at this step
    assert callback(2, {"step": 2, "test_accuracy": 0.7}) is False
    assert callback(3, {"step": 3, "eval_return": math.nan}) is False  # not reported
    with pytest.raises(optuna.TrialPruned, match="test_accuracy 0.2 at step 4"):
        callback(4, {"step": 4, "test_accuracy": 0.2})
    assert callback(10, {"step": 10, "eval_return": 0.1}) is False  # the last step completes the trial
    assert trial.reports == [(2, 0.7), (4, 0.2), (10, 0.1)]


def test_bad_trials_are_pruned_from_their_intermediate_evaluations(tmp_path):
    base = TrainConfig.flat(**{**FAST, "steps": 20, "population": 32, "batch_size": 16, "hidden": (16,)})
    study = tune(base, {"lr": {"low": 1e-6, "high": 1.0, "log": True}}, trials=8, out=tmp_path, log=quiet,
                 pruner=optuna.pruners.MedianPruner(n_startup_trials=2), plots=False)
    assert TrialState.PRUNED in states(study)
    pruned = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert all(t.intermediate_values and t.last_step < 20 for t in pruned)
    assert len(study.trials) == 8  # pruned trials count towards the cap


def test_the_pruners_by_name():
    cfg = TrainConfig.flat(**FAST).resolved()
    from nesgpu.tune.space import make_space

    space = make_space(TrainConfig.flat(**FAST), LR)
    assert isinstance(make_pruner("median", cfg, space), optuna.pruners.MedianPruner)
    assert isinstance(make_pruner("hyperband", cfg, space), optuna.pruners.HyperbandPruner)
    assert isinstance(make_pruner("none", cfg, space), optuna.pruners.NopPruner)
    with pytest.raises(ValueError, match=r"pruner must be one of \['median', 'hyperband', 'none'\]"):
        make_pruner("asha", cfg, space)


@pytest.mark.parametrize("sampler, pruner", [("gp", "hyperband"), ("cmaes", "median")])
def test_the_other_samplers_and_pruners_run(tmp_path, sampler, pruner):
    space = {**LR, "sigma": {"low": 0.01, "high": 0.5, "log": True}}
    study = tune(TrainConfig.flat(**FAST), space, trials=3, out=tmp_path, sampler=sampler, pruner=pruner, log=quiet,
                 plots=False)
    assert len(study.trials) == 3 and TrialState.FAIL not in states(study)


def test_cmaes_warns_that_choices_are_drawn_at_random(tmp_path):
    space = {**LR, "hidden": {"choices": ["8", "8,8"]}}
    with pytest.warns(UserWarning, match=r"--sampler cmaes samples numeric options only: \['hidden'\]"):
        tune(TrainConfig.flat(**FAST), space, trials=1, out=tmp_path, sampler="cmaes", log=quiet, plots=False)


def test_the_base_configs_out_is_dropped_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="the base config's out .* is not used"):
        study = tune(TrainConfig.flat(**FAST, out=str(tmp_path / "run")), LR, trials=1, out=tmp_path / "t", log=quiet,
                     plots=False)
    assert study.trials[0].user_attrs["run_dir"] == str(tmp_path / "t" / "trials" / "0000")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs, message", [
    (dict(trials=None), "give trials"),
    (dict(trials=2, sampler="random"), r"sampler must be one of \['tpe', 'gp', 'cmaes'\]; got 'random'"),
    (dict(trials=2, pruner="asha"), r"pruner must be one of"),
    (dict(trials=2, timeout=-1), "timeout must be a positive number"),
    (dict(trials=2.5), "trials must be a whole number"),
])
def test_bad_arguments_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tune(TrainConfig.flat(**FAST), LR, out=tmp_path / "t", log=quiet, **kwargs)
    assert not (tmp_path / "t").exists()


def test_a_plot_that_needs_more_trials_is_skipped_with_a_note(tmp_path):
    lines = []
    tune(TrainConfig.flat(**FAST), LR, trials=1, out=tmp_path, log=lines.append)
    assert "no param_importances.png: it needs 2 complete trial(s); the study has 1" in lines
    assert (tmp_path / "optimization_history.png").is_file() and not (tmp_path / "param_importances.png").exists()


def test_a_trial_another_process_marked_failed_meanwhile_is_noted_and_the_study_goes_on(tmp_path, monkeypatch):
    def late_heartbeat(cfg, **kwargs):
        summary = train(cfg, **kwargs)
        if cfg.out.endswith("0000"):  # another process saw no heartbeat for three beats
            storage = open_storage(tmp_path, heartbeat=10)
            study = optuna.load_study(study_name=tmp_path.name, storage=storage)
            storage.set_trial_state_values(trial_id(storage, study, 0), TrialState.FAIL)
        return summary

    monkeypatch.setattr(study_module, "train", late_heartbeat)
    lines = []
    study = tune(TrainConfig.flat(**FAST), LR, trials=1, out=tmp_path, log=lines.append, plots=False)
    assert states(study) == [TrialState.FAIL, TrialState.COMPLETE]
    assert "but another process had marked it failed (its heartbeat was late)" in lines[0]


def test_the_runs_notes_are_kept_and_its_progress_lines_dropped(tmp_path):
    lines = []
    tune(TrainConfig.flat(**FAST, target=0.0, progress_every=1e-9), LR, trials=1, out=tmp_path, log=lines.append,
         plots=False)
    assert lines[0].startswith("trial 0: test_accuracy ") and "reached the target 0 at step 1" in lines[0]
    assert lines[1].startswith("trial 0 test_accuracy ")
    assert len(lines) == 2  # no "step 1/6 ..." progress line, no final line of the run


def test_a_tune_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        main(["tune", *FAST_FLAGS, "--trials", "1", "--out", str(tmp_path / "file")])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"nesgpu tune: error: --out {tmp_path / 'file'} is a file; expected a directory for the tune (study.db, "
        f"trials/, ...)")


def test_a_damaged_study_db_is_one_line_and_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "t"
    out.mkdir()
    (out / "study.db").write_bytes(b"not a database, but someone's bytes")
    with pytest.raises(SystemExit) as stop:
        main(["tune", *FAST_FLAGS, "--trials", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0] == (f"nesgpu tune: error: {out / 'study.db'} cannot be read as a study database (file is not a "
                      f"database); move it away to start a new study there, or choose another --out")
    assert (out / "study.db").read_bytes() == b"not a database, but someone's bytes"
