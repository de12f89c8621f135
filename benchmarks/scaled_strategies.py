"""A sigma per parameter against one sigma for all, on the test functions of the issue that asked for it:
population 32 (16 antithetic pairs; sep_cma_es and cma_es: 32 independent members, their default), 400
generations, start at 0, sigma 1, a parameter vector (``nn.Linear(1, n)`` without bias) trained through ``nesgpu.train.train`` with a task whose fitness is minus the function; each
strategy at its defaults (openai_es: Adam at lr auto, sigma / 10; snes: eta_mu 1 and its sigma rate from n; cem:
half the members elite; sep_cma_es and cma_es: the tutorial's rates from n).

    python benchmarks/scaled_strategies.py [--generations 400] [--seeds 3] [--out benchmarks/results/scaled_cpu.json]
        [--functions sphere,ellipsoid,rastrigin,rosenbrock] [--dims 30,100,sphere=1000] [--strategies snes,cma_es]

Functions (optimum 0 at x = 1, the start 0 is at distance sqrt(n)):
  sphere      sum_i (x_i - 1)^2                                       (default n = 100)
  ellipsoid   sum_i 10^(4 i / (n - 1)) (x_i - 1)^2, i = 0..n-1, condition 1e4       (default n = 30)
  rastrigin   10 n + sum_i ((x_i - 1)^2 - 10 cos(2 pi (x_i - 1)))     (multimodal, value n at the start)
  rosenbrock  sum_{i<n-1} 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2       (standard, unshifted: its optimum is at 1;
              value n - 1 at the start)
``--functions`` (comma list) picks the functions, ``--dims`` (comma list) the sizes: a bare n applies to every
picked function, ``name=n`` to that function only; without ``--dims`` each function runs at its default n alone
(sphere 100, ellipsoid 30, rastrigin 30, rosenbrock 30). ``--strategies`` (comma list of the names below, e.g.
``"snes,cem smoothing=1"``) restricts the strategies. The default run (sphere n=100, ellipsoid n=30, every
strategy) gives the rows it gave before the options existed.

Prints, per function, n and strategy, the median over seeds of the final value (the mean's, not the best member's)
and of the wall time per generation; also the process's CPU time per generation (time.process_time: one thread,
so it is the wall time the run would take alone, robust to other processes sharing the cores). A run whose sigma
falls below nesgpu's floor (MIN_SIGMA, 1e-12: converged to float64 noise) stops there, as the next step would
refuse that sigma; its row then lists ``generations_run``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from nesgpu.model import MIN_SIGMA
from nesgpu.train import TrainConfig, train

SHIFT = 1.0


def sphere(x: torch.Tensor) -> torch.Tensor:
    return (x - SHIFT).pow(2).sum(-1)


def ellipsoid(x: torch.Tensor) -> torch.Tensor:
    """Condition 1e4: the i-th axis weighted 10^(4 i / (n - 1))."""
    n = x.shape[-1]
    weights = 10 ** (4 * torch.arange(n, dtype=x.dtype) / max(n - 1, 1))
    return ((x - SHIFT).pow(2) * weights).sum(-1)


def rastrigin(x: torch.Tensor) -> torch.Tensor:
    z = x - SHIFT
    return 10 * x.shape[-1] + (z.pow(2) - 10 * torch.cos(2 * torch.pi * z)).sum(-1)


def rosenbrock(x: torch.Tensor) -> torch.Tensor:
    """The standard form, not shifted: its optimum is already at 1."""
    head, tail = x[..., :-1], x[..., 1:]
    return (100 * (tail - head.pow(2)).pow(2) + (1 - head).pow(2)).sum(-1)


# each function with the n it runs at without --dims
FUNCTIONS = {"sphere": (sphere, 100), "ellipsoid": (ellipsoid, 30), "rastrigin": (rastrigin, 30),
             "rosenbrock": (rosenbrock, 30)}
DEFAULT_FUNCTIONS = ("sphere", "ellipsoid")
# each strategy at its defaults; cem also replacing sigma outright (EvoTorch's CEM) instead of 10% of the way
VARIANTS = {"openai_es": {}, "snes": {}, "cem": {}, "cem smoothing=1": {"smoothing": 1.0}, "sep_cma_es": {},
            "cma_es": {}, "xnes": {}, "snes no-antithetic": {"antithetic": False},
            "sep_cma_es antithetic": {"antithetic": True}, "cma_es antithetic": {"antithetic": True}}


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


def run(name: str, n: int, strategy: str, generations: int, seed: int, **options) -> dict:
    """One run; ms per generation from the end of generation 1 to the end of the last (the trainer's whole
    step: evaluation, update, metrics row), as the peers' are timed after their first (compiling) one. A run
    whose next sigma falls below nesgpu's floor MIN_SIGMA (1e-12; the next step would refuse it: a step size that
    converged to the float64 noise, as sep_cma_es's does on the sphere at n = 30) or is not finite is stopped
    there: ``generations`` says where, the value is at that generation's mean."""
    function = FUNCTIONS[name][0]
    model = nn.Linear(1, n, bias=False).double()
    nn.init.zeros_(model.weight)
    ends = {}

    def clock(step, row):
        ends[step] = time.perf_counter(), time.process_time()
        sigma = float(row["sigma"])
        return not (math.isfinite(sigma) and sigma >= MIN_SIGMA)

    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(strategy=strategy, layer="gaussian", population=32, sigma=1.0, steps=generations,
                          seed=seed, eval_every=generations, checkpoint_every=generations, log="none",
                          out=str(Path(out) / "run"), **options)
        train(cfg, model=model, task=Minimise(function, n), log=lambda *a, **k: None, callback=clock)
    last = max(ends)
    return {"value": float(function(model.weight[:, 0].detach())),
            "ms_per_generation": 1000 * (ends[last][0] - ends[1][0]) / max(last - 1, 1),
            "cpu_ms_per_generation": 1000 * (ends[last][1] - ends[1][1]) / max(last - 1, 1), "generations": last}


def problems(functions: list[str], dims: str | None) -> list[tuple[str, int]]:
    """(function, n) pairs, in the order of ``functions`` then of n: ``dims`` is a comma list of bare n (every
    function) and ``name=n`` (that function only); None: each function at its default n."""
    unknown = [f for f in functions if f not in FUNCTIONS]
    if unknown:
        raise SystemExit(f"unknown function(s) {unknown}; choose from {sorted(FUNCTIONS)}")
    if dims is None:
        return [(f, FUNCTIONS[f][1]) for f in functions]
    pairs = []
    for f in functions:
        sizes = []
        for item in dims.split(","):
            name, _, size = item.strip().rpartition("=")
            if name and name not in FUNCTIONS:
                raise SystemExit(f"--dims names unknown function {name!r}")
            if not name or name == f:
                sizes.append(int(size))
        pairs += [(f, n) for n in sorted(set(sizes))]
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--functions", default=",".join(DEFAULT_FUNCTIONS),
                        help=f"comma list of {', '.join(FUNCTIONS)} (default: %(default)s)")
    parser.add_argument("--dims", default=None,
                        help="comma list of n (every function) or name=n (that one); default: each function's own n")
    parser.add_argument("--strategies", default=None, help=f"comma list of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    strategies = list(VARIANTS) if args.strategies is None else [s.strip() for s in args.strategies.split(",")]
    unknown = [s for s in strategies if s not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown strategy(ies) {unknown}; choose from {list(VARIANTS)}")
    grid = problems([f.strip() for f in args.functions.split(",")], args.dims)
    torch.set_num_threads(1)
    rows = []
    for name, n in grid:
        for strategy in strategies:
            options = VARIANTS[strategy]
            runs = [run(name, n, strategy.split()[0], args.generations, seed, **options)
                    for seed in range(args.seeds)]
            row = {"function": name, "n": n, "strategy": strategy,
                   "value": statistics.median(r["value"] for r in runs),
                   "ms_per_generation": statistics.median(r["ms_per_generation"] for r in runs),
                   "cpu_ms_per_generation": statistics.median(r["cpu_ms_per_generation"] for r in runs),
                   "values": [r["value"] for r in runs]}
            if any(r["generations"] < args.generations for r in runs):  # stopped at the sigma floor (run())
                row["generations_run"] = [r["generations"] for r in runs]
            rows.append(row)
            print(f"{name:10s} n={row['n']:4d} {strategy:17s} value {row['value']:.3g}  "
                  f"{row['ms_per_generation']:.2f} ms/generation (CPU {row['cpu_ms_per_generation']:.2f})  "
                  f"(seeds {', '.join(f'{v:.3g}' for v in row['values'])})"
                  + (f"  stopped at the sigma floor: generations {row['generations_run']}" if "generations_run" in row
                     else ""), flush=True)
            if args.out is not None:  # after every row, so that a cut run keeps what it finished
                args.out.write_text(json.dumps({"generations": args.generations, "seeds": args.seeds,
                                                "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
