"""Compare two trees of run directories (benchmarks/identical_runs.sh): each run's weights bit for bit, and
its metrics.csv row by row except the wall-clock seconds.

    python benchmarks/identical_runs.py BEFORE AFTER      # exit status 1 when any run differs
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from safetensors.torch import load_file


def rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]


def same(a: Path, b: Path) -> tuple[bool, bool]:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    weights = wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)
    return weights, rows(a / "metrics.csv") == rows(b / "metrics.csv")


def main(before: str, after: str) -> int:
    differ = 0
    for run in sorted(p for p in Path(before).iterdir() if p.is_dir()):
        try:
            weights, metrics = same(run, Path(after) / run.name)
        except (OSError, ValueError) as e:
            weights = metrics = False
            print(f"{run.name}: {e}")
        print(f"{run.name:16s} weights {'same' if weights else 'DIFFER'}  metrics {'same' if metrics else 'DIFFER'}")
        differ += not (weights and metrics)
    print("all the same" if not differ else f"{differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
