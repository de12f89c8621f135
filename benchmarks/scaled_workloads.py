"""A sigma per parameter against one sigma for all, on the trainer's own workloads, at the same wall time.

Each run is one ``nesgpu train`` process on the CPU (OMP_NUM_THREADS=1, --device cpu) stopped by
``--time-budget`` (``--steps`` set far beyond what the budget allows); sigma, population, model, batch and
episodes are the task's defaults for every setting, and each strategy's own step size (openai_es: the task's
lr, Adam; snes / sep_cma_es / cem: their lr 1 with their own sigma rules). The settings:

    openai_es               the task's default layer (lowrank)
    openai_es gaussian      --layer gaussian (IID noise, one sigma)
    snes / sep_cma_es / cem --layer gaussian (IID noise, a sigma per parameter)
    snes lowrank            the task's default layer: low-rank noise, a row x column sigma per matrix
    cma_es gaussian         --layer gaussian, a full covariance (policies: a few hundred parameters)

gym tasks run with ``--target 1e12`` so that every run uses its whole budget (the env's reward_threshold would
stop a solved run early); the first evaluation at or above the threshold is recorded (``solved_at_s``).
The LM demo is left out (it needs a local model directory).

    python benchmarks/scaled_workloads.py [--budget 60] [--gym-budget 90] [--seeds 0,1] [--jobs 2]
        [--gym gym:InvertedPendulum-v5] [--out benchmarks/results/scaled_workloads_cpu.json]

Each row: the final metric (summary value: the evaluation after the last step), the best evaluation, the steps
done, the median step time (median difference of metrics.csv's seconds between consecutive steps, so that the
periodic evaluations are left out) and the command. Results are written after every run; ``--resume`` keeps
the rows already in --out and runs only the missing ones.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NESGPU = str(ROOT / ".venv" / "bin" / "nesgpu")

SETTINGS = {
    "openai_es": [],  # the task's default layer (lowrank)
    "openai_es gaussian": ["--layer", "gaussian"],
    "snes gaussian": ["--strategy", "snes", "--layer", "gaussian"],
    "sep_cma_es gaussian": ["--strategy", "sep_cma_es", "--layer", "gaussian"],
    "cem gaussian": ["--strategy", "cem", "--layer", "gaussian"],
    "snes lowrank": ["--strategy", "snes"],  # the task's default layer: a row x column sigma per matrix
    "cma_es gaussian": ["--strategy", "cma_es", "--layer", "gaussian"],  # small policies only (n <= 10,000)
}
GYM_THRESHOLDS = {"gym:InvertedPendulum-v5": 950.0, "gym:InvertedDoublePendulum-v5": 9100.0}


def command(task: str, setting: str, seed: int, budget: float, out: str) -> list[str]:
    cmd = [NESGPU, "train", "--task", task, *SETTINGS[setting], "--device", "cpu", "--seed", str(seed),
           "--steps", "1000000", "--time-budget", str(budget), "--log", "none"]
    if task.startswith("gym:"):
        cmd += ["--target", "1e12"]
    return [*cmd, "--out", out]


def run(task: str, setting: str, seed: int, budget: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="scaled_workloads_") as tmp:
        out = str(Path(tmp) / "run")
        cmd = command(task, setting, seed, budget, out)
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        shown = "OMP_NUM_THREADS=1 " + shlex.join([".venv/bin/nesgpu", *cmd[1:-1], "RUNDIR"])
        row = {"task": task, "setting": setting, "seed": seed, "budget_s": budget, "wall_s": round(wall, 1),
               "command": shown}
        if proc.returncode != 0:
            row["error"] = (proc.stderr or proc.stdout)[-2000:]
            return row
        summary = None
        for line in reversed(proc.stdout.strip().splitlines()):
            try:
                summary = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
        if summary is None:
            summary = json.loads((Path(out) / "summary.json").read_text())
        with open(Path(out) / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        times = [(int(r["step"]), float(r["seconds"])) for r in rows if r.get("seconds") not in ("", None)]
        diffs = [b[1] - a[1] for a, b in zip(times, times[1:]) if b[0] == a[0] + 1 and a[0] >= 1]
        metric = summary["metric"]
        row.update(metric=metric, value=summary["value"], best=summary.get("best"), steps=summary["steps"],
                   seconds=summary["seconds"], stopped=summary.get("stopped"),
                   parameters=summary.get("parameters"), population=summary.get("population"),
                   sigma=summary.get("sigma"), lr=summary.get("lr"),
                   step_ms=round(1000 * statistics.median(diffs), 2) if diffs else None)
        threshold = GYM_THRESHOLDS.get(task)
        if threshold is not None:
            solved = [float(r["seconds"]) for r in rows if r.get(metric) not in ("", None)
                      and float(r[metric]) >= threshold]
            row.update(threshold=threshold, solved_at_s=round(solved[0], 1) if solved else None)
        return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per run: digits, mnist1d, pendulum")
    parser.add_argument("--gym-budget", type=float, default=90.0, help="seconds per run: the gym task")
    parser.add_argument("--gym", default="gym:InvertedPendulum-v5", help="a MuJoCo task, or none")
    parser.add_argument("--tasks", default="digits,mnist1d,pendulum")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--jobs", type=int, default=2, help="runs at the same time (one core each)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/scaled_workloads_cpu.json")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --out")
    args = parser.parse_args()

    tasks = args.tasks.split(",")
    if args.gym != "none":
        try:
            subprocess.run([str(ROOT / ".venv/bin/python"), "-c", "import mujoco, gymnasium"], check=True,
                           capture_output=True)
            tasks = [args.gym, *tasks]  # the longest runs first
        except subprocess.CalledProcessError:
            print(f"mujoco/gymnasium not installed: {args.gym} left out", file=sys.stderr)
    jobs = [(t, s, seed, args.gym_budget if t.startswith("gym:") else args.budget)
            for seed in map(int, args.seeds.split(",")) for t in tasks for s in args.settings.split(",")]
    rows = json.loads(args.out.read_text())["rows"] if args.resume and args.out.exists() else []
    done = {(r["task"], r["setting"], r["seed"]) for r in rows if "error" not in r}
    rows = [r for r in rows if "error" not in r]
    jobs = [j for j in jobs if j[:3] not in done]
    lock = threading.Lock()

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"what": "per-parameter sigma (snes, sep_cma_es, cem; --layer gaussian) vs openai_es at the same "
                        "wall time per run; sigma, population, model at each task's defaults",
                "device": "cpu", "threads_per_run": 1, "concurrent_runs": args.jobs, "budget_s": args.budget,
                "gym_budget_s": args.gym_budget, "lm_demo": "left out: it needs a local model directory"}
        ordered = sorted(rows, key=lambda r: (r["seed"], r["task"], list(SETTINGS).index(r["setting"])))
        args.out.write_text(json.dumps({**meta, "rows": ordered}, indent=1) + "\n")

    def one(job) -> None:
        row = run(*job)
        with lock:
            rows.append(row)
            save()
            if "error" in row:
                print(f"{job}: FAILED {row['error'][-300:]}", flush=True)
            else:
                extra = f" solved_at {row.get('solved_at_s')}s" if "threshold" in row else ""
                print(f"{row['task']:24s} {row['setting']:20s} seed {row['seed']} {row['metric']} "
                      f"{row['value']:.4g} (best {row['best']:.4g}) steps {row['steps']} "
                      f"{row['step_ms']} ms/step{extra}  [{row['wall_s']}s]", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, jobs))
    save()


if __name__ == "__main__":
    main()
