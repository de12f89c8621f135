"""What a run records: metrics.csv (always), experiment trackers (TensorBoard by default) and curve.png."""

from __future__ import annotations

import csv
import io
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from .checkpoint import atomic_write_text
from .loggers import Logger, make_loggers
from ...files import open_regular

COLUMNS = ["step", "seconds"]
# the columns a run has once a row fills them (a language model's run fills no RL or supervised column), and the
# names an LM run gives env_steps and lr (nesgpu.tasks.generation's column_names)
OPEN_COLUMNS = frozenset({"env_steps", "fitness_mean", "fitness_max", "fitness_min", "sigma", "lr", "no_signal",
                          "train_loss", "episode_return", "test_accuracy", "eval_return", "num_tokens",
                          "learning_rate"})
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
        rows = self.read(self.path) if resume_step and os.path.lexists(self.path) else []
        self.rows = [r for r in rows if r["step"] <= resume_step]
        after = [r["step"] for r in rows if r["step"] > resume_step]
        if after:  # written after the checkpoint by the run that was stopped: the resumed run writes them again
            rows, are = ((f"row of step {after[0]}", "is") if len(after) == 1 else
                         (f"rows of steps {min(after)}-{max(after)}", "are"))
            warnings.warn(f"{self.path}: the {rows}, after the checkpoint's step {resume_step}, {are} dropped: the "
                          f"run goes on from step {resume_step}", stacklevel=2)
        self.columns = COLUMNS + [c for c in dict.fromkeys(extra_columns) if c not in COLUMNS]
        self.columns += [k for k in dict.fromkeys(k for r in self.rows for k in r) if k not in self.columns]  # every
        # column a resumed run's rows have (an older nesgpu's too)
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
        """The rows of a metrics.csv (values as numbers); one that nesgpu did not write is a ValueError naming the
        file and line."""
        path, line, rows, damaged = Path(path), 1, [], None
        try:
            with open_regular(path, newline="") as f:
                reader = csv.reader(f)
                header = _header(next(reader, None), path)
                for values in reader:
                    if damaged is not None:  # a line that is not the last
                        raise damaged
                    line = reader.line_num
                    try:
                        rows.append(_row(header, values, path, line))
                    except ValueError as e:
                        damaged = e
        except csv.Error as e:
            raise ValueError(f"{path}, line {line + 1}: {e}; expected the metrics.csv a run writes") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text ({e.reason}); expected the metrics.csv a run writes") from None
        if damaged is not None:  # the last line, cut short by a kill: after the checkpoint, written again
            warnings.warn(f"{path}: its last line was cut short (a killed run); it is dropped", stacklevel=3)
        return rows

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


def _header(names: list[str] | None, path: Path) -> list[str]:
    """metrics.csv's first line: its column names, each once, ``step`` among them."""
    expected = "expected the metrics.csv a run writes"
    if not names:
        raise ValueError(f"{path} has no header line; {expected}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{path}: its header names column {twice[0]!r} twice; {expected}")
    if "step" not in names:
        raise ValueError(f"{path}: its header has no 'step' column (it begins {','.join(names[:3])[:60]!r}); "
                         f"{expected}")
    return names


def _row(header: list[str], values: list[str], path: Path, line: int) -> dict:
    """One line of metrics.csv as a row: its non-empty values, as numbers, the step a whole number >= 0."""
    where = f"{path}, line {line}"
    if len(values) > len(header):
        raise ValueError(f"{where} has {len(values)} values; the header names {len(header)} columns")
    try:
        row = {name: _parse(value) for name, value in zip(header, values) if value != ""}
    except ValueError:
        bad = next((n, v) for n, v in zip(header, values) if v != "" and not _is_number(v))
        raise ValueError(f"{where}: {bad[0]} is {bad[1]!r:.40}; expected a number") from None
    step = row.get("step")
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"{where}: step is {step!r}; expected a whole number >= 0")
    return row


def _is_number(text: str) -> bool:
    try:
        _parse(text)
    except ValueError:
        return False
    return True


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
    return [k for k in dict.fromkeys(k for r in rows for k in r)
            if (k.startswith(OPEN_PREFIXES) or k in OPEN_COLUMNS) and k not in columns]


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
    evaluation metric. A generation task (``reward``): the training reward (the raw one, of the members and
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
        elif any(r.get(key) is not None for r in rows for key in ("reward", "reward_mean")):  # a generation task
            reward = "reward" if any("reward" in r for r in rows) else "reward_mean"  # before TRL's names
            _line(axes[0], rows, reward, "mean over the members")
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
