"""A sigma per parameter against one sigma for all, on the test functions of the issue that asked for it:
population 32 (16 antithetic pairs), 400 generations, start at 0, sigma 1, a parameter vector (``nn.Linear(1, n)``
without bias) trained through ``nesgpu.train.train`` with a task whose fitness is minus the function; each
strategy at its defaults (openai_es: Adam at lr auto, sigma / 10; snes: eta_mu 1 and its sigma rate from n; cem:
half the members elite).

    python benchmarks/scaled_strategies.py [--generations 400] [--seeds 3] [--out benchmarks/results/scaled_cpu.json]

Prints, per function and strategy, the median over seeds of the final value (the mean's, not the best member's)
and of the wall time per generation. The functions are shifted so that the optimum is at 1 (start: 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from nesgpu.train import TrainConfig, train

SHIFT = 1.0


def sphere(x: torch.Tensor) -> torch.Tensor:
    return (x - SHIFT).pow(2).sum(-1)


def ellipsoid(x: torch.Tensor) -> torch.Tensor:
    """Condition 1e4: the i-th axis weighted 10^(4 i / (n - 1))."""
    n = x.shape[-1]
    weights = 10 ** (4 * torch.arange(n, dtype=x.dtype) / max(n - 1, 1))
    return ((x - SHIFT).pow(2) * weights).sum(-1)


FUNCTIONS = {"sphere": (sphere, 100), "ellipsoid": (ellipsoid, 30)}
# each strategy at its defaults; cem also replacing sigma outright (EvoTorch's CEM) instead of 10% of the way
VARIANTS = {"openai_es": {}, "snes": {}, "cem": {}, "cem smoothing=1": {"smoothing": 1.0}, "sep_cma_es": {},
            "cma_es": {}}


class Minimise:
    """Fitness: minus the function at each member's parameter vector."""

    metric, default_target, summed_info = "minus_value", None, frozenset()

    def __init__(self, function, n: int):
        self.function, self.n = function, n

    def fitness(self, pm, step):
        rows = pm(torch.ones((2 if pm.antithetic else 1) * pm.local_directions, 1, dtype=torch.float64))
        return -self.function(rows).view(-1, pm.local_directions), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return float(-self.function(model.weight[:, 0].detach()))


def run(name: str, strategy: str, generations: int, seed: int, **options) -> dict:
    """One run; ms per generation from the end of generation 1 to the end of the last (the trainer's whole
    step: evaluation, update, metrics row), as the peers' are timed after their first (compiling) one."""
    function, n = FUNCTIONS[name]
    model = nn.Linear(1, n, bias=False).double()
    nn.init.zeros_(model.weight)
    ends = {}

    def clock(step, row):
        ends[step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(strategy=strategy, layer="gaussian", population=32, sigma=1.0, steps=generations,
                          seed=seed, eval_every=generations, checkpoint_every=generations, log="none",
                          out=str(Path(out) / "run"), **options)
        train(cfg, model=model, task=Minimise(function, n), log=lambda *a, **k: None, callback=clock)
    seconds = ends[generations] - ends[1]
    return {"value": float(function(model.weight[:, 0].detach())),
            "ms_per_generation": 1000 * seconds / (generations - 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in FUNCTIONS:
        for strategy, options in VARIANTS.items():
            runs = [run(name, strategy.split()[0], args.generations, seed, **options) for seed in range(args.seeds)]
            row = {"function": name, "n": FUNCTIONS[name][1], "strategy": strategy,
                   "value": statistics.median(r["value"] for r in runs),
                   "ms_per_generation": statistics.median(r["ms_per_generation"] for r in runs)}
            rows.append(row)
            print(f"{name:9s} n={row['n']:4d} {strategy:17s} value {row['value']:.3g}  "
                  f"{row['ms_per_generation']:.2f} ms/generation", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"generations": args.generations, "seeds": args.seeds, "rows": rows},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
