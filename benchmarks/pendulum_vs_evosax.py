"""Torch-batched Pendulum, side by side with evosax + gymnax (issue 10): environment steps per second of the
whole ES loop (ask, every member's 200-step episode, tell), population 256, MLP 3-64-1, one episode per member.

nesgpu runs eagerly and compiled (``--compile on``: each env step with the population forward as one
torch.compile program); the compile time is measured apart (the first step) and also counted in a
"with compile" rate over the timed steps. The JAX side runs benchmarks/jax_pendulum.py in its own venv
(``bash benchmarks/setup_jax_env.sh`` makes .venv-jax; skipped when it is missing). Rounds alternate the
three; the table gives medians.

Run: python benchmarks/pendulum_vs_evosax.py [--rounds 3] [--steps 30] [--population 256] [--hidden 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from nesgpu.train import TrainConfig
from nesgpu.train.setup.build import build

ROOT = Path(__file__).resolve().parents[1]
JAX_PYTHON = ROOT / ".venv-jax" / "bin" / "python"


def nesgpu_round(compiled: bool, population: int, hidden: int, steps: int) -> dict:
    """A fresh run: the first ES step (compiling, when compiled) timed apart, then ``steps`` steps."""
    cfg = TrainConfig.flat(task="pendulum", population=population, hidden=(hidden,), episodes=1, strategy="openai_es",
                      compile="on" if compiled else "off", device="cpu").resolved()
    step = build(cfg, torch.device("cpu"), log=lambda *a: None).step
    t0 = time.perf_counter()
    step.run()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step.run()
    seconds = time.perf_counter() - t0
    env_steps = population * 200 * steps
    return {"env_steps_per_s": env_steps / seconds, "first_step_s": first,
            "with_first_step": population * 200 * (steps + 1) / (seconds + first)}


def jax_round(population: int, hidden: int, generations: int) -> dict | None:
    if not JAX_PYTHON.exists():
        return None
    out = subprocess.run([str(JAX_PYTHON), str(ROOT / "benchmarks" / "jax_pendulum.py"), "--population",
                          str(population), "--hidden", str(hidden), "--generations", str(generations), "--rounds",
                          "1"], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="timed ES steps (generations) per round")
    parser.add_argument("--population", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    rows: dict[str, list[dict]] = {"nesgpu eager": [], "nesgpu compiled": [], "evosax + gymnax (jit)": []}
    for _ in range(args.rounds):
        rows["nesgpu eager"].append(nesgpu_round(False, args.population, args.hidden, args.steps))
        rows["nesgpu compiled"].append(nesgpu_round(True, args.population, args.hidden, args.steps))
        result = jax_round(args.population, args.hidden, args.steps)
        if result is not None:
            rows["evosax + gymnax (jit)"].append({"env_steps_per_s": result["env_steps_per_s"],
                                                  "first_step_s": result["compile_s"]})
    reference = statistics.median(r["env_steps_per_s"] for r in rows["evosax + gymnax (jit)"]) \
        if rows["evosax + gymnax (jit)"] else None
    print(f"Pendulum, population {args.population}, hidden {args.hidden}, {args.steps} timed steps, "
          f"{torch.get_num_threads()} torch threads, median of {args.rounds} rounds")
    print("| loop | env steps/s | vs evosax + gymnax | first step (compile) s |\n|---|---:|---:|---:|")
    for name, results in rows.items():
        if not results:
            print(f"| {name} | (not run: bash benchmarks/setup_jax_env.sh) | | |")
            continue
        rate = statistics.median(r["env_steps_per_s"] for r in results)
        first = results[0]["first_step_s"]  # the first round compiles; later rounds reuse its programs
        ratio = f"{rate / reference:.2f}x" if reference else "-"
        print(f"| {name} | {rate / 1e6:.2f} M | {ratio} | {first:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
