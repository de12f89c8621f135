"""The BENCHMARKS.md tables of the strategy grid: nesgpu's rows (one or more scaled_strategies.py JSON files; a
later file's row replaces an earlier one of the same function, n and strategy) beside evosax's and EvoTorch's
(scaled_vs_peers.py JSON files), median final value per (function, n) and algorithm family.

    python benchmarks/scaled_tables.py --nesgpu benchmarks/results/scaled_strategies_grid_cpu.json \
        benchmarks/results/scaled_strategies_grid_cma_cpu.json \
        --evosax benchmarks/results/scaled_vs_peers_grid_evosax.json \
        --evotorch benchmarks/results/scaled_vs_peers_grid_evotorch.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FAMILIES = [  # (column, nesgpu strategy, evosax algorithm, EvoTorch algorithm)
    ("SNES", "snes", "SNES", "SNES"),
    ("sep-CMA-ES", "sep_cma_es", "Sep_CMA_ES", "CMAES (separable)"),
    ("CMA-ES", "cma_es", "CMA_ES", "CMAES"),
    ("CEM", "cem", "SimpleES (CEM-like)", "CEM"),
]


def rows_of(paths: list[Path], key: str) -> dict:
    table = {}
    for path in paths:
        for row in json.loads(path.read_text())["rows"]:
            table[(row["function"], row["n"], row[key])] = row
    return table


def cell(row: dict | None, field: str = "value") -> str:
    return "" if row is None else f"{row[field]:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nesgpu", type=Path, nargs="+", required=True)
    parser.add_argument("--evosax", type=Path, required=True)
    parser.add_argument("--evotorch", type=Path, required=True)
    args = parser.parse_args()
    ours = rows_of(args.nesgpu, "strategy")
    evosax, evotorch = rows_of([args.evosax], "algorithm"), rows_of([args.evotorch], "algorithm")
    problems = sorted({(f, n) for f, n, _ in ours}, key=lambda p: (p[0], p[1]))
    extra = sorted({s for _, _, s in ours} - {f[1] for f in FAMILIES})
    print("| function | n | " + " | ".join(f"{c} nesgpu / evosax / EvoTorch" for c, *_ in FAMILIES) + " | "
          + " | ".join(extra) + " |")
    print("|---|---:|" + "---|" * (len(FAMILIES) + len(extra)))
    for f, n in problems:
        cells = [" / ".join(cell(t.get((f, n, k))) for t, k in ((ours, s), (evosax, e), (evotorch, t_)))
                 for _, s, e, t_ in FAMILIES]
        print(f"| {f} | {n} | " + " | ".join(cells) + " | " + " | ".join(cell(ours.get((f, n, s))) for s in extra)
              + " |")
    print()
    print("| function | n | " + " | ".join(f"{c} ms (CPU) nesgpu / EvoTorch" for c, *_ in FAMILIES) + " |")
    print("|---|---:|" + "---|" * len(FAMILIES))
    for f, n in problems:
        cells = [" / ".join(cell(t.get((f, n, k)), "cpu_ms_per_generation") for t, k in ((ours, s), (evotorch, t_)))
                 for _, s, _, t_ in FAMILIES]
        print(f"| {f} | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
