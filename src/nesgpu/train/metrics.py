"""What a run records: metrics.csv (always), TensorBoard events and curve.png (when installed)."""

from __future__ import annotations

import csv
import math
import warnings
from pathlib import Path

COLUMNS = ["step", "seconds", "env_steps", "fitness_mean", "fitness_max", "fitness_min", "sigma", "lr",
           "train_loss", "episode_return", "test_accuracy", "eval_return"]


class MetricsLog:
    """Appends one row per step to ``metrics.csv`` and mirrors it to TensorBoard.

    On resume, rows after the checkpoint's step are dropped, so the file reads as one uninterrupted run.
    """

    def __init__(self, out: Path, resume_step: int = 0):
        self.path = Path(out) / "metrics.csv"
        rows = self.read(self.path) if resume_step and self.path.exists() else []
        self.rows = [r for r in rows if int(r["step"]) <= resume_step]
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writeheader()
            writer.writerows({k: _fmt(r.get(k)) for k in COLUMNS} for r in self.rows)
        self.tensorboard = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=resume_step + 1)
        except ImportError:
            warnings.warn("tensorboard is not installed: no TensorBoard events (pip install 'nesgpu[train]')",
                          stacklevel=2)

    @staticmethod
    def read(path: Path) -> list[dict]:
        with open(path, newline="") as f:
            return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]

    def write(self, row: dict) -> None:
        self.rows.append(row)
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, COLUMNS).writerow({k: _fmt(row.get(k)) for k in COLUMNS})
        if self.tensorboard is not None:
            for key, value in row.items():
                if key != "step" and value is not None:
                    self.tensorboard.add_scalar(key, value, int(row["step"]))

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def plot_curve(rows: list[dict], metric: str, path: Path, title: str) -> bool:
    """Learning curve: mean population fitness and the evaluation metric against steps. False if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no curve.png (pip install 'nesgpu[train]')", stacklevel=2)
        return False
    fig, left = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in rows]
    left.plot(steps, [r.get("fitness_mean") for r in rows], color="tab:blue", label="mean fitness")
    left.set_xlabel("step")
    left.set_ylabel("mean fitness", color="tab:blue")
    evaluated = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None]
    if evaluated:
        right = left.twinx()
        right.plot(*zip(*evaluated), "o-", color="tab:orange", label=metric)
        right.set_ylabel(metric, color="tab:orange")
    left.set_title(title)
    fig.tight_layout()
    tmp = Path(path).with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return True
