"""Scale benchmarks (issue 4): throughput against population and chunk size, bf16 vs fp32, noise memory
per member, and 1 vs 2 processes.

Each measurement times whole ES steps (ask, population forward, tell) after warm-up steps and reports the
median over repeats. Throughput = population members evaluated per second.

Run: python benchmarks/scale.py [--quick] [--device cpu|cuda] [--json PATH]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import nesgpu
from nesgpu.train import TrainConfig
from nesgpu.train.setup.build import build


def step_time(cfg: TrainConfig, steps: int, warmup: int = 2) -> float:
    """Median seconds of one ES step of ``cfg`` (one process)."""
    cfg = cfg.resolved()
    device = torch.device(cfg.device)
    task, _, pm, population = build(cfg, device, log=lambda *a: None)
    times = []
    for step in range(1, warmup + steps + 1):
        t0 = time.perf_counter()
        population.run()  # reads the fitness statistics, so the step has run on the device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step > warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def digits(device: str = "cpu", **kw) -> TrainConfig:
    return TrainConfig.flat(task="digits", device=device, **{"hidden": (256, 256), "batch_size": 32, **kw})


def throughput_vs_population(steps, device="cpu"):
    rows = []
    for population in (128, 512, 2048, 8192) + ((32768,) if device != "cpu" else ()):
        t = step_time(digits(device, population=population), steps)
        rows.append({"population": population, "step_s": t, "members_per_s": population / t})
    return rows


def throughput_vs_chunk(steps, device="cpu"):
    population = 2048 if device == "cpu" else 16384
    rows = []
    base = None
    for chunk in (None, 512, 256, 64):
        t = step_time(digits(device, population=population, chunk_size=chunk), steps)
        base = base or t
        rows.append({"chunk": chunk or population // 2, "step_s": t, "members_per_s": population / t,
                     "vs_unchunked": base / t})
    return rows


def precision(steps, device="cpu"):
    population = 1024 if device == "cpu" else 16384
    fp32 = step_time(digits(device, population=population), steps)
    bf16 = step_time(digits(device, population=population, precision="bf16"), steps)
    return {"population": population, "fp32_step_s": fp32, "bf16_step_s": bf16, "bf16_speed_vs_fp32": fp32 / bf16}


def memory_per_member(directions=1024):
    """Noise bytes per direction for an MLP 784-256-256-10, per kind."""
    rows = {}
    for kind in nesgpu.layers.KINDS:
        model = nesgpu.convert(nn.Sequential(nn.Linear(784, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                                             nn.Linear(256, 10)), kind)
        pm = nesgpu.PerturbedModel(model, directions)
        pm.set_noise()
        total = pm.noise_bytes()
        rows[kind] = {"bytes_per_member": total / directions, "params": pm.num_perturbed}
    return rows


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(nproc: int, task_args: list[str], steps: int, out: str) -> subprocess.Popen:
    launcher = [sys.executable, "-m", "nesgpu"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}", "-m", "nesgpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # one thread per process, as torchrun's workers
    return subprocess.Popen([*launcher, "train", *task_args, "--steps", str(steps), "--device", "cpu",
                             "--eval-every", str(steps), "--checkpoint-every", str(steps), "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _steady_members_per_s(proc: subprocess.Popen, out: str, population: int) -> float:
    """Members per second after the first step (start-up, env creation and warm-up excluded)."""
    _, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"run failed:\n{err[-3000:]}")
    with open(os.path.join(out, "metrics.csv")) as f:
        seconds = [float(row["seconds"]) for row in csv.DictReader(f)]
    return population * (len(seconds) - 1) / (seconds[-1] - seconds[0])


def processes(task_args: list[str], steps: int, repeats: int = 3) -> dict:
    """Members per second of 1 process vs 2 (torchrun), and the machine's ceiling for 2: two independent
    single-process runs of half the population each, at the same time (no communication at all).
    Medians over ``repeats`` rounds of the three measurements; every round is kept in ``rounds``."""
    population = int(task_args[task_args.index("--population") + 1])
    half = [*task_args]
    half[half.index("--population") + 1] = str(population // 2)
    rounds = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as root:
            dirs = [os.path.join(root, name) for name in ("one", "two", "pair_a", "pair_b")]
            one = _steady_members_per_s(_launch(1, task_args, steps, dirs[0]), dirs[0], population)
            two = _steady_members_per_s(_launch(2, task_args, steps, dirs[1]), dirs[1], population)
            pair = [_launch(1, half, steps, d) for d in dirs[2:]]
            ceiling = sum(_steady_members_per_s(p, d, population // 2) for p, d in zip(pair, dirs[2:]))
        rounds.append({"one_members_per_s": one, "two_members_per_s": two, "speedup": two / one,
                       "ceiling_speedup": ceiling / one, "efficiency_vs_ceiling": two / ceiling})
    return {**{k: statistics.median(r[k] for r in rounds) for k in rounds[0]}, "rounds": rounds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the process scaling runs on CPU only)")
    parser.add_argument("--json")
    args = parser.parse_args()
    steps = 3 if args.quick else 7
    results = {
        "date": time.strftime("%Y-%m-%d"), "device": args.device, "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "population": throughput_vs_population(steps, args.device),
        "chunk": throughput_vs_chunk(steps, args.device),
        "precision": precision(steps, args.device),
        "memory": memory_per_member(),
    }
    if args.device == "cpu":
        results.update({
            # env-bound: gymnasium's Pendulum steps each env in Python, so the work grows with the rows
            "processes_env_bound": processes(["--task", "gym:Pendulum-v1", "--strategy", "openai_es",
                                              "--population", "128", "--hidden", "32"], 4 if args.quick else 12),
            # the torch-batched Pendulum: so cheap per row that fixed per-step costs dominate
            "processes_torch_env": processes(["--task", "pendulum", "--strategy", "openai_es", "--population",
                                              "256", "--hidden", "64", "--episodes", "1"], 6 if args.quick else 20),
            "processes_supervised": processes(["--task", "digits", "--population", "512"],
                                              20 if args.quick else 60),
        })
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
