"""The ARS training loop against the bare simulator: environment steps per second on a MuJoCo task.

Three rates, in rounds that alternate them (median of ``--rounds``):

- bare sync: gymnasium's own SyncVectorEnv of ``2N`` copies stepping a zero action, nothing else;
- bare async: the same rows in gymnasium's AsyncVectorEnv (one subprocess each);
- nesgpu: ``nesgpu train --preset ars-paper`` (2N rows, the linear policy, observation statistics, the
  update) for ``--steps`` ES steps without evaluations, env steps of training / seconds of training.

The loop's share of the bare rate is what the ES machinery costs on top of the simulation.

Run: python benchmarks/ars_throughput.py [--env HalfCheetah-v5] [--steps 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from nesgpu.train import TrainConfig, train


def bare(env_id: str, rows: int, steps: int, mode: str) -> float:
    import gymnasium as gym

    env = gym.make_vec(env_id, num_envs=rows, vectorization_mode=mode)
    try:
        env.reset(seed=0)
        action = np.zeros(env.action_space.shape, dtype=np.float32)
        start = time.perf_counter()
        for _ in range(steps):
            env.step(action)  # autoreset keeps every row stepping
        return rows * steps / (time.perf_counter() - start)
    finally:
        env.close()


def loop(env_id: str, steps: int, out: str) -> tuple[float, int]:
    cfg = TrainConfig(task=f"gym:{env_id}", preset="ars-paper", steps=steps, eval_every=10**6, target=1e9,
                      device="cpu", out=out, log="none", checkpoint_every=10**6)
    summary = train(cfg, log=lambda *a, **k: None, overwrite=True)
    return summary["env_steps"] / summary["seconds"], cfg.resolved().population


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--steps", type=int, default=5, help="ES steps of the loop per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"bare sync": [], "bare async": [], "nesgpu ARS loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            rate, rows = loop(args.env, args.steps, f"{tmp}/run")
            rates["nesgpu ARS loop"].append(rate)
            rates["bare sync"].append(bare(args.env, rows, 1000, "sync"))
            rates["bare async"].append(bare(args.env, rows, 300, "async"))
    base = statistics.median(rates["bare sync"])
    print(f"{args.env}, {rows} rows (ars-paper preset), median of {args.rounds} rounds")
    print("| loop | env steps/s | vs bare sync |\n|---|---:|---:|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
