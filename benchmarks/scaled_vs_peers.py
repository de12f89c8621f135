"""The problems of benchmarks/scaled_strategies.py run with the peers' strategies: evosax 0.3.x (JAX) or EvoTorch.

Same problems as scaled_strategies.py (nesgpu's openai_es / snes / cem / sep_cma_es / cma_es), optimum 0 at x = 1:
  sphere      sum_i (x_i - 1)^2                                       (default n = 100)
  ellipsoid   sum_i 10^(4 i / (n - 1)) (x_i - 1)^2, i = 0..n-1, condition 1e4       (default n = 30)
  rastrigin   10 n + sum_i ((x_i - 1)^2 - 10 cos(2 pi (x_i - 1)))     (multimodal; default n = 30)
  rosenbrock  sum_{i<n-1} 100 (x_{i+1} - x_i^2)^2 + (1 - x_i)^2       (standard, unshifted: optimum at 1 already;
              default n = 30)
The search distribution's mean starts at 0 with sigma 1; population 32; 400 generations; seeds 0, 1, 2. Each
algorithm is at its library's defaults except population, initial mean and initial sigma. The score is the function
at the distribution's MEAN after the last generation (not the best member seen), computed in float64 NumPy with the
formulas above; the per-(function, n, algorithm) figures are medians over the seeds.

    .venv-jax/bin/python       benchmarks/scaled_vs_peers.py --peer evosax   [--generations 400] [--seeds 3]
    .venv-evotorch/bin/python  benchmarks/scaled_vs_peers.py --peer evotorch [--generations 400] [--seeds 3]
        [--functions sphere,ellipsoid,rastrigin,rosenbrock] [--dims 30,100,sphere=1000] [--algorithms SNES,CMAES]

``--functions`` (comma list) and ``--dims`` (comma list: a bare n for every picked function, ``name=n`` for that
function only) as in scaled_strategies.py; without them the run is the sphere at n = 100 and the ellipsoid at
n = 30, the rows it gave before the options existed. ``--algorithms`` (comma list of the peer's names below, e.g.
``"SNES,CMAES (separable)"``; ``--only`` takes the same names space-separated) restricts the algorithms.

(.venv-jax: bash benchmarks/setup_jax_env.sh; .venv-evotorch: python3 -m venv .venv-evotorch &&
.venv-evotorch/bin/pip install torch==2.13.0 evotorch==0.6.1.) Writes benchmarks/results/scaled_vs_peers_<peer>.json
unless --out is given.

Algorithms:
  evosax 0.3.x  (evosax.algorithms, minimising): SNES, Sep_CMA_ES, CMA_ES, and SimpleES as its CEM-like strategy
                (0.3.x has no class named CEM; SimpleES is the elites' mean with elite_ratio 0.5 and weights 1/e,
                its std moved 10% of the way, c_std = 0.1, to the elites' spread about the old mean).
  EvoTorch      (evotorch.algorithms on an evotorch.Problem("min", ..., vectorized=True)): SNES, CEM
                (parenthood_ratio 0.5, as nesgpu's elite_ratio), CMAES and CMAES(separable=True).

Timing: one generation is ask + evaluation of the whole population + tell. For evosax that is one jitted
function (jax.jit of ask -> the function on the (32, n) batch -> tell), for EvoTorch ``searcher.step()``. The
first generation (evosax: the XLA compile; EvoTorch: first sampling and lazy set-up) is run untimed and
reported as ``first_generation_ms``. (evosax's init state has weakly typed leaves that would make jax.jit compile
a second time at generation 2; the script makes them strongly typed first and checks that the jitted generation
compiled once.) ms_per_generation is the wall time of generations 2..G over G - 1, the clock read after
``jax.block_until_ready`` on the final state for evosax. Library set-up (constructing the problem and algorithm,
``init``) and the final scoring are outside the clock, as nesgpu's scaled_strategies.py times generations 2..G of
its trainer. ``cpu_ms_per_generation`` is the same span's process CPU time (time.process_time; one thread, so it is
the wall time the run would take alone, and robust to other processes sharing the cores).

Precision: float64 by default (``jax_enable_x64`` for evosax, ``Problem(dtype=torch.float64)`` for EvoTorch),
as scaled_strategies.py runs nesgpu in float64; ``--float32`` for the libraries' usual float32.

Threads: one. OMP_NUM_THREADS=1 and XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1
are set before JAX/torch are imported, and torch.set_num_threads(1).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

SHIFT = 1.0
POPULATION = 32
SIGMA_INIT = 1.0
# each function with the n it runs at without --dims
DIMS = {"sphere": 100, "ellipsoid": 30, "rastrigin": 30, "rosenbrock": 30}
DEFAULT_FUNCTIONS = ("sphere", "ellipsoid")


# The scoring functions, float64 NumPy, the formulas of scaled_strategies.py.
def sphere_np(x: np.ndarray) -> float:
    return float(((x - SHIFT) ** 2).sum(-1))


def ellipsoid_np(x: np.ndarray) -> float:
    n = x.shape[-1]
    weights = 10 ** (4 * np.arange(n, dtype=np.float64) / max(n - 1, 1))
    return float((((x - SHIFT) ** 2) * weights).sum(-1))


def rastrigin_np(x: np.ndarray) -> float:
    z = x - SHIFT
    return float(10 * x.shape[-1] + (z ** 2 - 10 * np.cos(2 * np.pi * z)).sum(-1))


def rosenbrock_np(x: np.ndarray) -> float:
    head, tail = x[..., :-1], x[..., 1:]
    return float((100 * (tail - head ** 2) ** 2 + (1 - head) ** 2).sum(-1))


SCORE = {"sphere": sphere_np, "ellipsoid": ellipsoid_np, "rastrigin": rastrigin_np, "rosenbrock": rosenbrock_np}


# --------------------------------------------------------------------------------------------------- evosax
def evosax_algorithms():
    from evosax.algorithms import CMA_ES, SNES, Sep_CMA_ES, SimpleES

    return {"SNES": SNES, "SimpleES (CEM-like)": SimpleES, "Sep_CMA_ES": Sep_CMA_ES, "CMA_ES": CMA_ES}


def evosax_run(function: str, n: int, algorithm: str, generations: int, seed: int, x64: bool) -> dict:
    import jax
    import jax.numpy as jnp

    dtype = jnp.float64 if x64 else jnp.float32

    def sphere(x):
        return jnp.sum((x - SHIFT) ** 2, axis=-1)

    def ellipsoid(x):
        m = x.shape[-1]
        weights = 10 ** (4 * jnp.arange(m, dtype=x.dtype) / max(m - 1, 1))
        return jnp.sum((x - SHIFT) ** 2 * weights, axis=-1)

    def rastrigin(x):
        z = x - SHIFT
        return 10 * x.shape[-1] + jnp.sum(z ** 2 - 10 * jnp.cos(2 * jnp.pi * z), axis=-1)

    def rosenbrock(x):
        head, tail = x[..., :-1], x[..., 1:]
        return jnp.sum(100 * (tail - head ** 2) ** 2 + (1 - head) ** 2, axis=-1)

    f = {"sphere": sphere, "ellipsoid": ellipsoid, "rastrigin": rastrigin, "rosenbrock": rosenbrock}[function]
    mean0 = jnp.zeros(n, dtype)
    es = evosax_algorithms()[algorithm](population_size=POPULATION, solution=mean0)
    params = es.default_params
    params = params.replace(std_init=jnp.asarray(SIGMA_INIT, dtype) if not isinstance(params.std_init, float)
                            else SIGMA_INIT)
    key = jax.random.key(seed)
    key, k_init = jax.random.split(key)
    state = es.init(k_init, mean0, params)
    # init returns some weakly typed leaves (generation_counter, best_fitness, ...) that come back strongly typed
    # from the first generation, which would make jax.jit compile the generation a second time at generation 2:
    # make them strong here so that the one compile is in the untimed first generation.
    state = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.asarray(a).dtype), state)

    @jax.jit
    def generation(key, state):
        key, k_ask, k_tell = jax.random.split(key, 3)
        population, state = es.ask(k_ask, state, params)
        fitness = f(population)  # (32, n) -> (32,), minimised by evosax
        state, _ = es.tell(k_tell, population, fitness, state, params)
        return key, state

    t0 = time.perf_counter()
    key, state = jax.block_until_ready(generation(key, state))  # compile + generation 1, untimed
    first = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(generations - 1):
        key, state = generation(key, state)
    jax.block_until_ready(state)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    compiles = generation._cache_size()
    if compiles != 1:
        print(f"warning: the generation was compiled {compiles} times (the timing includes the extra)")
    mean = np.asarray(es.get_mean(state), dtype=np.float64)
    return {"value": SCORE[function](mean), "ms_per_generation": 1000 * seconds / max(generations - 1, 1),
            "cpu_ms_per_generation": 1000 * cpu / max(generations - 1, 1), "first_generation_ms": 1000 * first,
            "compiles": compiles}


# ------------------------------------------------------------------------------------------------- EvoTorch
def evotorch_run(function: str, n: int, algorithm: str, generations: int, seed: int, x64: bool) -> dict:
    import logging

    import torch
    from evotorch import Problem
    from evotorch.algorithms import CEM, CMAES, SNES

    logging.getLogger("evotorch").setLevel(logging.WARNING)  # its INFO lines for every Problem made
    torch.set_num_threads(1)
    dtype = torch.float64 if x64 else torch.float32

    def sphere(x: torch.Tensor) -> torch.Tensor:
        return (x - SHIFT).pow(2).sum(-1)

    def ellipsoid(x: torch.Tensor) -> torch.Tensor:
        m = x.shape[-1]
        weights = 10 ** (4 * torch.arange(m, dtype=x.dtype) / max(m - 1, 1))
        return ((x - SHIFT).pow(2) * weights).sum(-1)

    def rastrigin(x: torch.Tensor) -> torch.Tensor:
        z = x - SHIFT
        return 10 * x.shape[-1] + (z.pow(2) - 10 * torch.cos(2 * torch.pi * z)).sum(-1)

    def rosenbrock(x: torch.Tensor) -> torch.Tensor:
        head, tail = x[..., :-1], x[..., 1:]
        return (100 * (tail - head.pow(2)).pow(2) + (1 - head).pow(2)).sum(-1)

    f = {"sphere": sphere, "ellipsoid": ellipsoid, "rastrigin": rastrigin, "rosenbrock": rosenbrock}[function]
    torch.manual_seed(seed)
    np.random.seed(seed)
    problem = Problem("min", f, solution_length=n,
                      initial_bounds=(-1.0, 1.0), dtype=dtype, device="cpu", seed=seed, vectorized=True)
    center = torch.zeros(n, dtype=dtype)
    common = {"popsize": POPULATION, "stdev_init": SIGMA_INIT, "center_init": center}
    if algorithm == "SNES":
        searcher = SNES(problem, **common)
    elif algorithm == "CEM":
        searcher = CEM(problem, parenthood_ratio=0.5, **common)
    elif algorithm == "CMAES":
        searcher = CMAES(problem, **common)
    elif algorithm == "CMAES (separable)":
        searcher = CMAES(problem, separable=True, **common)
    else:
        raise ValueError(algorithm)

    t0 = time.perf_counter()
    searcher.step()  # generation 1, untimed
    first = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(generations - 1):
        searcher.step()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    mean = searcher.status["center"]
    mean = np.asarray(mean.detach().cpu().double().numpy() if hasattr(mean, "detach") else mean, dtype=np.float64)
    return {"value": SCORE[function](mean), "ms_per_generation": 1000 * seconds / max(generations - 1, 1),
            "cpu_ms_per_generation": 1000 * cpu / max(generations - 1, 1), "first_generation_ms": 1000 * first}


PEERS = {
    "evosax": {"run": evosax_run, "algorithms": ("SNES", "SimpleES (CEM-like)", "Sep_CMA_ES", "CMA_ES"),
               "packages": ("evosax", "jax", "jaxlib", "optax", "flax", "numpy")},
    "evotorch": {"run": evotorch_run, "algorithms": ("SNES", "CEM", "CMAES (separable)", "CMAES"),
                 "packages": ("evotorch", "torch", "numpy")},
}


def problems(functions: list[str], dims: str | None) -> list[tuple[str, int]]:
    """(function, n) pairs, in the order of ``functions`` then of n: ``dims`` is a comma list of bare n (every
    function) and ``name=n`` (that function only); None: each function at its default n (scaled_strategies.py's
    parsing)."""
    unknown = [f for f in functions if f not in DIMS]
    if unknown:
        raise SystemExit(f"unknown function(s) {unknown}; choose from {sorted(DIMS)}")
    if dims is None:
        return [(f, DIMS[f]) for f in functions]
    pairs = []
    for f in functions:
        sizes = []
        for item in dims.split(","):
            name, _, size = item.strip().rpartition("=")
            if name and name not in DIMS:
                raise SystemExit(f"--dims names unknown function {name!r}")
            if not name or name == f:
                sizes.append(int(size))
        pairs += [(f, n) for n in sorted(set(sizes))]
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=sorted(PEERS), required=True)
    parser.add_argument("--generations", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--float32", action="store_true", help="the library's float32 instead of float64")
    parser.add_argument("--functions", default=",".join(DEFAULT_FUNCTIONS),
                        help=f"comma list of {', '.join(DIMS)} (default: %(default)s)")
    parser.add_argument("--dims", default=None,
                        help="comma list of n (every function) or name=n (that one); default: each function's own n")
    parser.add_argument("--algorithms", default=None, help="comma list, a subset of the peer's algorithms")
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the peer's algorithms (space-separated)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    x64 = not args.float32
    peer = PEERS[args.peer]
    only = (args.only or []) + ([a.strip() for a in args.algorithms.split(",")] if args.algorithms else [])
    unknown = [a for a in only if a not in peer["algorithms"]]
    if unknown:
        raise SystemExit(f"unknown algorithm(s) {unknown}; {args.peer} has {list(peer['algorithms'])}")
    grid = problems([f.strip() for f in args.functions.split(",")], args.dims)
    if args.peer == "evosax":
        import jax

        jax.config.update("jax_enable_x64", x64)
    versions = {}
    for name in peer["packages"]:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    print(f"{args.peer}: {versions}, {'float64' if x64 else 'float32'}, python {platform.python_version()}",
          flush=True)
    out = args.out or Path(__file__).resolve().parent / "results" / f"scaled_vs_peers_{args.peer}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for function, n in grid:
        for algorithm in peer["algorithms"]:
            if only and algorithm not in only:
                continue
            runs = [peer["run"](function, n, algorithm, args.generations, seed, x64) for seed in range(args.seeds)]
            row = {"function": function, "n": n, "library": args.peer, "algorithm": algorithm,
                   "value": statistics.median(r["value"] for r in runs),
                   "ms_per_generation": statistics.median(r["ms_per_generation"] for r in runs),
                   "cpu_ms_per_generation": statistics.median(r["cpu_ms_per_generation"] for r in runs),
                   "first_generation_ms": statistics.median(r["first_generation_ms"] for r in runs),
                   "values": [r["value"] for r in runs]}
            rows.append(row)
            print(f"{function:10s} n={row['n']:4d} {algorithm:20s} value {row['value']:.3g}  "
                  f"{row['ms_per_generation']:.3f} ms/generation (CPU {row['cpu_ms_per_generation']:.3f})  "
                  f"(first {row['first_generation_ms']:.0f} ms; "
                  f"seeds {', '.join(f'{v:.3g}' for v in row['values'])})", flush=True)
            # after every row, so that a cut run keeps what it finished
            out.write_text(json.dumps({
                "peer": args.peer, "versions": versions, "python": platform.python_version(),
                "dtype": "float64" if x64 else "float32", "generations": args.generations, "seeds": args.seeds,
                "population": POPULATION, "sigma_init": SIGMA_INIT, "mean_init": 0.0, "shift": SHIFT,
                "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "XLA_FLAGS")},
                "timing": "ms_per_generation: generations 2..G over G-1 (generation 1, incl. jit compile, is "
                          "first_generation_ms); cpu_ms_per_generation: the same generations' process CPU time; "
                          "value: the function at the final mean, median over seeds",
                "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
