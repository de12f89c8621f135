"""What a run records: metrics.csv (always), experiment trackers (TensorBoard by default) and curve.png."""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

from .checkpoint import atomic_write_text
from .loggers import Logger, make_loggers

COLUMNS = ["step", "seconds", "env_steps", "fitness_mean", "fitness_max", "fitness_min", "sigma", "lr",
           "no_signal", "train_loss", "episode_return", "test_accuracy", "eval_return"]
# the prefixes of columns that appear when a value first does: what a reward function logs (by its own names),
# what a generation task logs under TRL's names (nesgpu.tasks.reward_stats), and its evaluations' columns and
# distance from the starting model (nesgpu.tasks.generation_eval)
OPEN_PREFIXES = ("log_metric/", "eval_log_metric/", "rewards/", "completions/", "frac_reward_zero_std", "kl",
                 "eval_", "drift_nll")


class MetricsLog:
    """Appends one row per step to ``metrics.csv`` and forwards it to experiment trackers.

    ``loggers``: the trackers (see :func:`nesgpu.train.storage.loggers.make_loggers`); None: TensorBoard when
    installed. ``extra_columns``: columns beyond the usual ones (a custom task's metric).
    ``config`` (the run's configuration as a dict) goes to each tracker's ``start``. A tracker that
    raises is dropped with one warning; the run and metrics.csv go on. On resume, rows after the
    checkpoint's step are dropped, so the file reads as one uninterrupted run.
    """

    def __init__(self, out: Path, resume_step: int = 0, loggers: Sequence[Logger] | None = None,
                 config: dict | None = None, extra_columns: Sequence[str] = ()):
        self.path = Path(out) / "metrics.csv"
        rows = self.read(self.path) if resume_step and self.path.exists() else []
        self.rows = [r for r in rows if int(r["step"]) <= resume_step]
        self.columns = COLUMNS + [c for c in dict.fromkeys(extra_columns) if c not in COLUMNS]
        self.columns += _opened(self.rows, self.columns)
        self._file = self._writer = None  # the file kept open for appending rows (after the first)
        self._rewrite()
        self.loggers = list(make_loggers(None, Path(out)) if loggers is None else loggers)
        self.closed = False
        for logger in list(self.loggers):
            self._call(logger, "start", dict(config or {}), resume_step)

    def _rewrite(self) -> None:
        """The whole file, atomically: a kill while a new column opens leaves the rows written before."""
        self._close_file()  # the path is replaced: the next row opens the new file
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, self.columns)
        writer.writeheader()
        writer.writerows({k: _fmt(r.get(k)) for k in self.columns} for r in self.rows)
        atomic_write_text(self.path, text.getvalue())

    @staticmethod
    def read(path: Path) -> list[dict]:
        with open(path, newline="") as f:
            return [{k: _parse(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]

    def write(self, row: dict) -> None:
        """Append ``row``'s values of the file's columns (every value goes to the trackers). A key with one of
        ``OPEN_PREFIXES`` that is not a column yet becomes one: the file is written again with it."""
        self.rows.append(row)
        opened = _opened([row], self.columns)
        if opened:
            self.columns += opened
            self._rewrite()
        else:
            self._append(row)
        step = int(row["step"])
        for logger in list(self.loggers):
            self._call(logger, "log", step, dict(row))

    def _append(self, row: dict) -> None:
        """``row`` at the end of the file, through a handle kept open between rows (opening the file costs more
        than the row) and flushed, so that a killed run's file has every row written."""
        if self._file is None:
            self._file = open(self.path, "a", newline="")
            self._writer = csv.writer(self._file)
        self._writer.writerow([_fmt(row.get(k)) for k in self.columns])
        self._file.flush()

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = self._writer = None

    def close(self, summary: dict | None = None, status: str | None = None) -> None:
        """End the trackers' runs: with the run's ``summary`` when it finished (hyperparameters and final
        values), without one when it failed (``status``: "FAILED" by default, "KILLED" for an interrupted
        run). Only the first call counts."""
        self._close_file()
        if self.closed:
            return
        self.closed = True
        for logger in list(self.loggers):
            self._call(logger, "finish", summary, status)
        self.loggers = []

    finish = close

    def _call(self, logger: Logger, method: str, *args) -> None:
        """One tracker call; a tracker that raises (network, disk, a bad value) is warned about once and
        dropped (its run is still ended, quietly, if it was started)."""
        try:
            getattr(logger, method)(*args)
        except Exception as e:
            name = getattr(logger, "name", type(logger).__name__)
            warnings.warn(f"logger {name!r} failed in {method}() ({type(e).__name__}: {e}); the run goes on "
                          f"without it", RuntimeWarning, stacklevel=3)
            self.loggers.remove(logger)
            if method != "finish":
                try:
                    logger.finish(None, "FAILED")
                except Exception:
                    pass


def _parse(text: str) -> int | float:
    """A value as written by :func:`_fmt`: integers (steps, env steps) stay exact ints, so a resumed run's
    rewritten rows keep every digit."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _opened(rows: list[dict], columns: list[str]) -> list[str]:
    """The keys of ``rows`` with one of ``OPEN_PREFIXES`` that are not among ``columns``, in order of appearance."""
    return [k for k in dict.fromkeys(k for r in rows for k in r) if k.startswith(OPEN_PREFIXES) and k not in columns]


def _line(axis, rows: list[dict], column: str, label: str | None) -> None:
    """``column`` against the step, over the rows that have it."""
    points = [(r["step"], r[column]) for r in rows if r.get(column) is not None]
    if points:
        axis.plot(*zip(*points), color="tab:blue", label=label)


def plot_curve(rows: list[dict], metric: str, path: Path, title: str) -> bool:
    """Write :func:`curve_figure` to ``path`` (atomically); False if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no curve.png (pip install 'nesgpu[train]')", stacklevel=2)
        return False
    fig = curve_figure(rows, metric, title)
    tmp = Path(path).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return True


def curve_figure(rows: list[dict], metric: str, title: str):
    """The learning curve against steps, one axis per quantity, each named with its sign. A supervised run
    (rows with ``train_loss``): the training loss (an ES member's fitness is its negated loss) above the
    evaluation metric. A generation task (``reward_mean``): the training reward (the raw one, of the members and
    the best member) above the metric. An RL run (``eval_return``): the training episodes' mean return and the evaluation
    return on one axis. Any other task: its mean fitness above its metric. Every metric is higher-better."""
    import matplotlib.pyplot as plt

    evaluated = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None]
    if metric == "eval_return":
        fig, top = plt.subplots(figsize=(7, 4))
        axes = [top]
        _line(top, rows, "episode_return", "training episodes (mean over the population)")
        if evaluated:
            top.plot(*zip(*evaluated), "o-", color="tab:orange", label="evaluation (the mean policy)")
        top.set_ylabel("return (higher is better)")
        top.legend(loc="best")
    else:
        fig, axes = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
        if any(r.get("train_loss") is not None for r in rows):
            es = any(r.get("fitness_mean") is not None for r in rows)
            _line(axes[0], rows, "train_loss", None)
            axes[0].set_ylabel("training loss (lower is better)" + ("\nES fitness = -loss" if es else ""))
        elif any(r.get("reward_mean") is not None for r in rows):  # a generation task: its raw reward
            _line(axes[0], rows, "reward_mean", "mean over the members")
            points = [(r["step"], r["reward_best"]) for r in rows if r.get("reward_best") is not None]
            if points:
                axes[0].plot(*zip(*points), color="tab:green", alpha=0.6, label="best member")
            axes[0].set_ylabel("training reward (higher is better)")
            axes[0].legend(loc="best")
        else:
            _line(axes[0], rows, "fitness_mean", None)
            axes[0].set_ylabel("mean fitness (higher is better)")
        if evaluated:
            axes[1].plot(*zip(*evaluated), "o-", color="tab:orange")
        axes[1].set_ylabel(f"{metric} (higher is better)")
    axes[-1].set_xlabel("step")
    axes[0].set_title(title)
    return fig
