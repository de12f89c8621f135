"""nesgpu's per-parameter / covariance strategies against the same algorithms run by evosax and EvoTorch
themselves, on two control tasks, scored by one function.

What: SNES, separable CMA-ES and CMA-ES (nesgpu: snes / sep_cma_es / cma_es with the gaussian layer; evosax:
SNES / Sep_CMA_ES / CMA_ES; EvoTorch: SNES / CMAES(separable=True) / CMAES) on
  pendulum           nesgpu's torch-batched Pendulum-v1 (task "pendulum"), evosax on gymnax's Pendulum-v1,
                     EvoTorch on gymnasium's Pendulum-v1 through GymNE;
  inverted_pendulum  gymnasium's MuJoCo InvertedPendulum-v5 (nesgpu: task "gym:InvertedPendulum-v5"; EvoTorch:
                     GymNE("InvertedPendulum-v5"); evosax has no MuJoCo environment: not run there).
Every final mean is exported into ONE torch policy in this venv and scored by ONE function: its mean return
over the same fixed evaluation episodes (gymnasium env, reset seeds 10_000 + i) on gymnasium's own
Pendulum-v1 / InvertedPendulum-v5. The table gives the median over seeds of that score per (task, algorithm,
library), and the wall seconds per generation (median over seeds of each run's mean over generations 2..G;
the first generation - evosax's XLA compile, lazy set-up elsewhere - is reported apart as first_generation_s).

Design (the same work on every side):
  * policy: obs -> Linear(obs, 16) -> tanh -> Linear(16, act) -> high * tanh (high: the action bound, 2 for
    Pendulum, 3 for InvertedPendulum), i.e. nesgpu's RL Policy with --hidden 16, in torch's nn.Linear layout
    on every side (flat vector [W1, b1, W2, b2]); NO observation normalisation anywhere. nesgpu's RL tasks
    normalise observations by running statistics for these strategies, evosax has no normaliser and EvoTorch's
    RunningNorm does not clip as nesgpu's does, so the only equal choice is none: nesgpu runs through its Python
    API with make_task(..., normalize_observations=False) (the CLI has no switch for it).
  * the same initial mean: nesgpu's own initial policy for the seed (torch's default Linear init under
    torch.manual_seed(seed)), handed to evosax (init mean) and EvoTorch (center_init); the nesgpu run checks
    that it starts from the very same vector.
  * the same initial sigma (--sigma, 0.5), population (--population 32; nesgpu's snes: 16 antithetic pairs, both
    members counted; its sep_cma_es and cma_es, evosax and EvoTorch: 32 independent members, their default),
    one episode per member per
    generation from its own start state (nesgpu --start-states independent; evosax: a reset key per member;
    EvoTorch GymNE: one reset per rollout), the same number of generations per task (not the same wall time),
    each library's own default rates otherwise (lr 1 for the mean everywhere).
  * timing: jobs run two at a time (the VM has 2 cores), each single-threaded (OMP_NUM_THREADS=1, torch one
    thread, XLA_FLAGS one intra-op thread), so the sides run side by side on one core each.

Run (main venv; .venv-jax and .venv-evotorch next to it):
  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/control_vs_peers.py \
      [--tasks pendulum,inverted_pendulum] [--algos snes,sep_cma_es,cma_es] [--libraries nesgpu,evosax,evotorch] \
      [--seeds 0,1,2] [--generations pendulum=100,inverted_pendulum=30] [--population 32] [--sigma 0.5] \
      [--hidden 16] [--eval-episodes 20] [--jobs 2] [--out benchmarks/results/control_vs_peers_cpu.json]
Smoke test: --seeds 0 --generations pendulum=3,inverted_pendulum=2 --eval-episodes 2 --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = {"nesgpu": Path(sys.executable), "evosax": ROOT / ".venv-jax" / "bin" / "python",
           "evotorch": ROOT / ".venv-evotorch" / "bin" / "python"}
TASKS = {
    "pendulum": {"nesgpu": "pendulum", "gym": "Pendulum-v1", "libraries": ("nesgpu", "evosax", "evotorch")},
    "inverted_pendulum": {"nesgpu": "gym:InvertedPendulum-v5", "gym": "InvertedPendulum-v5",
                          "libraries": ("nesgpu", "evotorch")},
}
ALGOS = ("snes", "sep_cma_es", "cma_es")
PEER_NAMES = {"snes": {"evosax": "SNES", "evotorch": "SNES"},
              "sep_cma_es": {"evosax": "Sep_CMA_ES", "evotorch": "CMAES(separable=True)"},
              "cma_es": {"evosax": "CMA_ES", "evotorch": "CMAES"}}
EVAL_SEED = 10_000


# ---- the one policy and the one scoring function --------------------------------------------------------------

class ScoringPolicy(nn.Module):
    """obs -> Linear -> tanh -> Linear -> high * tanh: every side's policy, loaded from a flat vector."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, high: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, act_dim))
        self.high = high

    def load_flat(self, flat) -> ScoringPolicy:
        torch.nn.utils.vector_to_parameters(torch.as_tensor(flat, dtype=torch.float32), self.parameters())
        return self

    def forward(self, obs):
        return self.high * torch.tanh(self.net(obs))


def env_dims(gym_id: str) -> tuple[int, int, float]:
    import gymnasium as gym
    env = gym.make(gym_id)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    high = float(np.max(np.abs(np.concatenate([env.action_space.low, env.action_space.high]))))
    env.close()
    return obs_dim, act_dim, high


@torch.no_grad()
def score(gym_id: str, flat, hidden: int, episodes: int) -> float:
    """Mean return of the policy ``flat`` over ``episodes`` fixed episodes (reset seeds EVAL_SEED + i) of
    gymnasium's ``gym_id`` (its own TimeLimit; actions clipped to the action space)."""
    import gymnasium as gym
    obs_dim, act_dim, high = env_dims(gym_id)
    policy = ScoringPolicy(obs_dim, act_dim, hidden, high).load_flat(flat)
    env = gym.make(gym_id)
    low, up = env.action_space.low, env.action_space.high
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            action = policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, up))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


# ---- nesgpu ---------------------------------------------------------------------------------------------------

def nesgpu_setup(task_name: str, algo: str, seed: int, generations: int, population: int, sigma: float,
                 hidden: int):
    from nesgpu.tasks import make_task
    from nesgpu.train import TrainConfig

    cfg = TrainConfig.flat(task=TASKS[task_name]["nesgpu"], strategy=algo, layer="gaussian", population=population,
                      hidden=(hidden,), episodes=1, sigma=sigma, steps=generations, seed=seed, device="cpu",
                      compile="off", start_states="independent", policy_output="tanh").resolved()
    task = make_task(cfg.task, device="cpu", seed=seed, normalize_observations=False, episodes=1,
                     start_states="independent", policy_output="tanh")
    return cfg, task


def flat_of(model: nn.Module) -> list[float]:
    """The policy's parameters in nn.Linear layout [W1, b1, W2, b2] (nesgpu's Policy.net, ObservationNorm off)."""
    state = model.state_dict()
    names = ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    assert sorted(state) == sorted(names), sorted(state)
    return torch.cat([state[k].detach().float().reshape(-1) for k in names]).tolist()


def initial_flat(task_name: str, seed: int, hidden: int) -> list[float]:
    """nesgpu's initial policy of the seed, as its run builds it (nesgpu.train.setup.build.initial_model)."""
    from nesgpu.train.setup.build import initial_model

    cfg, task = nesgpu_setup(task_name, "snes", seed, 1, 32, 0.5, hidden)
    return flat_of(initial_model(cfg, task))


def nesgpu_worker(args) -> None:
    """One nesgpu run (a subprocess of the orchestrator): writes the same JSON as the peers' helpers."""
    import importlib.metadata

    from nesgpu.exporting import export
    from nesgpu.train.setup.build import build

    torch.set_num_threads(1)
    cfg, task = nesgpu_setup(args.task, args.algo, args.seed, args.generations, args.population, args.sigma,
                             args.hidden)
    built = build(cfg, torch.device("cpu"), task=task, log=lambda *a, **k: None)
    with open(args.init) as f:
        init = json.load(f)["init"]
    start = flat_of(export(built.model))
    assert np.allclose(start, init, atol=1e-7), "nesgpu does not start from the shared initial mean"
    curve, seconds = [], []
    for _ in range(args.generations):
        t0 = time.perf_counter()
        stats = built.step.run()
        seconds.append(time.perf_counter() - t0)
        curve.append(float(stats.get("episode_return", float("nan"))))
    result = {"library": "nesgpu", "algo": args.algo, "seed": args.seed, "task": args.task,
              "final_mean": flat_of(export(built.model)), "first_generation_s": seconds[0],
              "generation_s": seconds[1:], "train_mean_return": curve,
              "versions": {"nesgpu": importlib.metadata.version("nesgpu"), "torch": torch.__version__}}
    with open(args.out, "w") as f:
        json.dump(result, f)


# ---- the orchestrator -----------------------------------------------------------------------------------------

def job_command(job: dict, args, init_path: str, out_path: str) -> list[str]:
    common = ["--algo", job["algo"], "--seed", str(job["seed"]), "--generations", str(job["generations"]),
              "--population", str(args.population), "--sigma", str(args.sigma), "--hidden", str(args.hidden),
              "--init", init_path, "--out", out_path]
    lib = job["library"]
    if lib == "nesgpu":
        return [str(PYTHONS[lib]), __file__, "--worker", "--task", job["task"], *common]
    if lib == "evosax":
        return [str(PYTHONS[lib]), str(ROOT / "benchmarks" / "control_vs_peers_evosax.py"), *common]
    return [str(PYTHONS[lib]), str(ROOT / "benchmarks" / "control_vs_peers_evotorch.py"), "--env",
            TASKS[job["task"]]["gym"], *common]


def run_job(job: dict, args, workdir: str, init_paths: dict) -> dict:
    out = os.path.join(workdir, f"{job['task']}_{job['algo']}_{job['library']}_{job['seed']}.json")
    cmd = job_command(job, args, init_paths[(job["task"], job["seed"])], out)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {**job, "error": proc.stderr[-3000:], "process_s": wall}
    with open(out) as f:
        result = json.load(f)
    print(f"  done {job['task']} {job['algo']} {job['library']} seed {job['seed']}: {wall:.1f} s", flush=True)
    return {**job, **result, "process_s": wall}


def parse_generations(text: str) -> dict[str, int]:
    out = {"pendulum": 100, "inverted_pendulum": 30}
    for part in filter(None, text.split(",")):
        name, value = part.split("=")
        out[name] = int(value)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="pendulum,inverted_pendulum")
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--libraries", default="nesgpu,evosax,evotorch")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--generations", default="", help="per task, e.g. pendulum=100,inverted_pendulum=30")
    p.add_argument("--population", type=int, default=32)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--jobs", type=int, default=2, help="processes at a time (the VM has 2 cores)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "control_vs_peers_cpu.json"))
    # worker mode (one nesgpu run; used by the orchestrator)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    p.add_argument("--algo", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.generations = int(args.generations)
        return nesgpu_worker(args)

    tasks, algos = args.tasks.split(","), args.algos.split(",")
    libraries, seeds = args.libraries.split(","), [int(s) for s in args.seeds.split(",")]
    generations = parse_generations(args.generations)
    workdir = tempfile.mkdtemp(prefix="control_vs_peers_")
    init_paths, init_scores = {}, {}
    for task in tasks:
        for seed in seeds:
            flat = initial_flat(task, seed, args.hidden)
            path = os.path.join(workdir, f"init_{task}_{seed}.json")
            with open(path, "w") as f:
                json.dump({"init": flat}, f)
            init_paths[(task, seed)] = path
            init_scores[f"{task}/{seed}"] = score(TASKS[task]["gym"], flat, args.hidden, args.eval_episodes)
    # libraries interleaved, so that the two jobs running at a time are mostly of different libraries
    jobs = [{"task": t, "algo": a, "seed": s, "library": lib, "generations": generations[t]}
            for t in tasks for a in algos for s in seeds for lib in libraries if lib in TASKS[t]["libraries"]]
    print(f"{len(jobs)} jobs, {args.jobs} at a time; work files in {workdir}", flush=True)
    started = time.time()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run_job(j, args, workdir, init_paths), jobs))
    for r in results:
        if "error" in r:
            print(f"FAILED {r['task']} {r['algo']} {r['library']} seed {r['seed']}:\n{r['error']}", file=sys.stderr)
            continue
        r["score"] = score(TASKS[r["task"]]["gym"], r["final_mean"], args.hidden, args.eval_episodes)
        r["mean_generation_s"] = float(np.mean(r["generation_s"])) if r["generation_s"] else r["first_generation_s"]

    table = []
    for task in tasks:
        for algo in algos:
            row = {"task": task, "algo": algo}
            for lib in libraries:
                runs = [r for r in results if (r["task"], r["algo"], r["library"]) == (task, algo, lib)
                        and "score" in r]
                if runs:
                    row[lib] = {"median_score": statistics.median(r["score"] for r in runs),
                                "scores": [r["score"] for r in runs],
                                "median_generation_s": statistics.median(r["mean_generation_s"] for r in runs),
                                "median_first_generation_s": statistics.median(r["first_generation_s"]
                                                                               for r in runs)}
            table.append(row)

    print(f"\nmedian over seeds {seeds} of the mean return over {args.eval_episodes} fixed gymnasium episodes; "
          f"wall s / generation (generations 2..G, two single-threaded jobs at a time)")
    print("| task | algorithm | nesgpu | evosax | EvoTorch | s/gen nesgpu | s/gen evosax | s/gen EvoTorch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in table:
        cells = [f"{row[lib]['median_score']:.1f}" if lib in row else "n/a" for lib in ("nesgpu", "evosax", "evotorch")]
        times = [f"{row[lib]['median_generation_s']:.3f}" if lib in row else "n/a"
                 for lib in ("nesgpu", "evosax", "evotorch")]
        print(f"| {row['task']} | {row['algo']} | " + " | ".join(cells + times) + " |")

    report = {
        "benchmark": "control_vs_peers", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "command": " ".join([os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
        "settings": {"tasks": tasks, "algos": algos, "libraries": libraries, "seeds": seeds,
                     "generations": {t: generations[t] for t in tasks}, "population": args.population,
                     "sigma": args.sigma, "hidden": args.hidden, "eval_episodes": args.eval_episodes,
                     "eval_seeds": f"{EVAL_SEED}..{EVAL_SEED + args.eval_episodes - 1}", "jobs": args.jobs,
                     "threads": "OMP_NUM_THREADS=1, torch 1 thread, XLA 1 intra-op thread",
                     "policy": f"obs -> {args.hidden} tanh -> act, high * tanh, no observation normalisation",
                     "peer_algorithms": PEER_NAMES},
        "initial_scores": init_scores, "table": table, "total_s": time.time() - started,
        "runs": [{k: v for k, v in r.items()} for r in results],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
