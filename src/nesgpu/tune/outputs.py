"""What a study leaves in its directory besides ``study.db`` and ``trials/``: ``trials.csv``, ``best.yaml``,
the plots, and the summary ``nesgpu tune`` prints.

Each file is written to a temporary name and renamed, so processes sharing a directory never leave a half
file; the last process to finish writes the complete picture.
"""

from __future__ import annotations

import csv
import io
import os
import sys
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from ..train.setup.config import TrainConfig
from .space import SearchSpace

# optuna.visualization.matplotlib function -> file name; parameter importances need two complete trials
PLOTS = {"plot_optimization_history": "optimization_history.png",
         "plot_param_importances": "param_importances.png",
         "plot_parallel_coordinate": "parallel_coordinate.png"}


def _log_to_stderr(*args, **kwargs) -> None:
    print(*args, file=sys.stderr, **kwargs)


def _replace(path: Path, write) -> None:
    """Call ``write(temporary path)``, then rename the result to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_outputs(study: optuna.Study, base: TrainConfig, space: SearchSpace, out: Path, plots: bool = True,
                  log=_log_to_stderr) -> None:
    """trials.csv, best.yaml (once a trial completed) and, with ``plots``, the PNG plots."""
    write_trials_csv(study, out / "trials.csv")
    if best_trial(study) is not None:
        write_best_yaml(study, base, space, out / "best.yaml")
    if plots:
        write_plots(study, out, log)


def write_trials_csv(study: optuna.Study, path: Path) -> None:
    """One row per trial, in the columns of Optuna's ``trials_dataframe`` (without needing pandas): number,
    state, value, datetime_start, datetime_complete, duration (seconds), params_<option>, user_attrs_<name>
    (run_dir, metric, error)."""
    trials = study.get_trials(deepcopy=False)
    params = list(dict.fromkeys(name for t in trials for name in t.params))
    attrs = list(dict.fromkeys(name for t in trials for name in t.user_attrs))
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["number", "state", "value", "datetime_start", "datetime_complete", "duration"]
                    + [f"params_{p}" for p in params] + [f"user_attrs_{a}" for a in attrs])
    for t in trials:
        duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and \
            t.datetime_start else ""
        writer.writerow([t.number, t.state.name, "" if t.value is None else t.value, t.datetime_start or "",
                         t.datetime_complete or "", duration] + [t.params.get(p, "") for p in params]
                        + [t.user_attrs.get(a, "") for a in attrs])
    _replace(path, lambda tmp: tmp.write_text(buffer.getvalue()))


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The complete trial with the highest value, or None before one completed."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return max(complete, key=lambda t: t.value) if complete else None


def best_config(study: optuna.Study, base: TrainConfig, space: SearchSpace) -> TrainConfig | None:
    """The best trial's full resolved config (``out`` None), or None before a trial completed."""
    best = best_trial(study)
    if best is None:
        return None
    cfg = space.apply(base, best.params).resolved()
    cfg.out = None
    return cfg


def write_best_yaml(study: optuna.Study, base: TrainConfig, space: SearchSpace, path: Path) -> None:
    """best.yaml: the best trial's resolved config without ``out``, which ``nesgpu train --config`` runs."""
    import yaml

    best = best_trial(study)
    values = yaml.safe_load(best_config(study, base, space).to_yaml())
    del values["out"]
    header = (f"# the best trial ({best.number}) of study {study.study_name!r}: "
              f"{best.user_attrs.get('metric', 'value')} = {best.value:.6g}\n"
              f"# run it: nesgpu train --config {path} [--out DIR]\n")
    _replace(path, lambda tmp: tmp.write_text(header + yaml.safe_dump(values, sort_keys=False)))


def write_plots(study: optuna.Study, out: Path, log=_log_to_stderr) -> list[Path]:
    """The PNG plots of :data:`PLOTS` in ``out`` (matplotlib's Agg backend: no display); a plot that cannot be
    drawn yet (no complete trial; importances: fewer than two) is skipped with a note."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    written = []
    for function, name in PLOTS.items():
        needed = 2 if function == "plot_param_importances" else 1
        if complete < needed:
            log(f"no {name}: it needs {needed} complete trial(s); the study has {complete}")
            continue
        with warnings.catch_warnings():  # matplotlib's notes on the axes of an option that never varied
            warnings.simplefilter("ignore", UserWarning)
            try:
                axes = getattr(vis, function)(study)
            except (ValueError, RuntimeError) as e:  # e.g. importances of options that never varied
                log(f"no {name}: {e}")
                continue
            figure = getattr(axes, "figure", None) or axes.flat[0].figure
            figure.set_size_inches(8, 5)
            figure.tight_layout()
            _replace(out / name, lambda tmp, figure=figure: figure.savefig(tmp, format="png", dpi=100))
        plt.close(figure)
        written.append(out / name)
    return written


def summary(study: optuna.Study, out: Path) -> list[str]:
    """The lines ``nesgpu tune`` prints at the end: the best value and options, and where the files are."""
    states = [t.state for t in study.get_trials(deepcopy=False)]
    tally = ", ".join(f"{states.count(s)} {s.name.lower()}" for s in (TrialState.COMPLETE, TrialState.PRUNED,
                                                                      TrialState.FAIL, TrialState.RUNNING)
                      if states.count(s))
    best = best_trial(study)
    if best is None:
        return [(f"study {study.study_name!r} in {out}: no complete trial ({tally or 'no trials'}); see "
                 f"{out / 'trials.csv'}")]
    lines = [f"study {study.study_name!r} in {out}: {tally}",
             (f"best: {best.user_attrs.get('metric', 'value')} = {best.value:.6g} (trial {best.number}, "
              f"{best.user_attrs.get('run_dir')})")]
    lines += [f"  {name}: {value:.6g}" if isinstance(value, float) else f"  {name}: {value}"
              for name, value in best.params.items()]
    plots = [name for name in PLOTS.values() if (out / name).is_file()]
    lines += [f"config: {out / 'best.yaml'} (nesgpu train --config {out / 'best.yaml'})",
              f"trials: {out / 'trials.csv'}" + (f"; plots: {', '.join(plots)}" if plots else "")]
    return lines


__all__ = ["PLOTS", "best_config", "best_trial", "summary", "write_best_yaml", "write_outputs", "write_plots",
           "write_trials_csv"]
