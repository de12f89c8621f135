"""CartPole-v1, side by side: nesgpu's default run vs EvoTorch's GymNE (PGPE and SNES), same machine.

Both sides train until the center policy's mean return over 10 evaluation episodes is 500 (the maximum),
or until a time limit. Training time excludes the evaluations (the same rule for both). Each side is
run with several seeds; the medians are reported.

Run: python benchmarks/cartpole_vs_evotorch.py [--seeds 5] [--limit 60] [--json PATH]
Needs evotorch (benchmark-only: pip install evotorch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch


def nesgpu_run(seed: int, limit: float, **overrides) -> dict:
    from nesgpu.train import TrainConfig
    from nesgpu.train.setup.build import build

    cfg = TrainConfig.flat(task="cartpole", seed=seed, device="cpu", out="/tmp/unused", **overrides).resolved()
    task, model, pm, stepper = build(cfg, torch.device("cpu"))
    task.eval_episodes = 10
    trained, env_steps = 0.0, 0
    for step in range(1, 100_000):
        t0 = time.perf_counter()
        stats = stepper.run()  # ask, evaluate, tell, update, optimizer step
        trained += time.perf_counter() - t0
        env_steps += int(stats["env_steps"])
        value = task.evaluate(model)
        if value >= 500 or trained > limit:
            return {"solved": value >= 500, "seconds": trained, "steps": step, "env_steps": env_steps}


def evotorch_run(seed: int, limit: float, algorithm: str) -> dict:
    from evotorch.algorithms import PGPE, SNES
    from evotorch.neuroevolution import GymNE

    torch.manual_seed(seed)
    np.random.seed(seed)
    problem = GymNE(env="CartPole-v1", network="Linear(obs_length, act_length)", observation_normalization=True,
                    num_episodes=1, num_actors=0)
    if algorithm == "pgpe":  # EvoTorch's recommended PGPE + ClipUp set-up for gym control
        searcher = PGPE(problem, popsize=64, center_learning_rate=0.075, stdev_learning_rate=0.1,
                        optimizer="clipup", optimizer_config={"max_speed": 0.15}, radius_init=0.27)
    else:
        searcher = SNES(problem, popsize=64, stdev_init=0.5)
    trained = 0.0
    for step in range(1, 100_000):
        t0 = time.perf_counter()
        searcher.step()
        trained += time.perf_counter() - t0
        center = searcher.status["center"]
        value = statistics.mean(problem.run(center, num_episodes=1)["cumulative_reward"] for _ in range(10))
        if value >= 500 or trained > limit:
            env_steps = int(searcher.status.get("total_interaction_count", 0))
            return {"solved": value >= 500, "seconds": trained, "steps": step, "env_steps": env_steps}


def summarize(runs: list[dict]) -> dict:
    return {"solved": sum(r["solved"] for r in runs), "runs": len(runs),
            "median_seconds": statistics.median(r["seconds"] for r in runs),
            "median_steps": statistics.median(r["steps"] for r in runs),
            "median_env_steps": statistics.median(r["env_steps"] for r in runs)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--limit", type=float, default=60.0, help="training seconds before giving up")
    parser.add_argument("--json")
    args = parser.parse_args()
    sides = {
        "nesgpu default (PGPE + ClipUp, linear)": lambda s: nesgpu_run(s, args.limit),
        "nesgpu OpenAI-ES + Adam (linear)": lambda s: nesgpu_run(s, args.limit, strategy="openai_es", lr=0.1),
        "EvoTorch GymNE + PGPE (linear)": lambda s: evotorch_run(s, args.limit, "pgpe"),
        "EvoTorch GymNE + SNES (linear)": lambda s: evotorch_run(s, args.limit, "snes"),
    }
    results = {name: summarize([run(seed) for seed in range(args.seeds)]) for name, run in sides.items()}
    base = results["EvoTorch GymNE + PGPE (linear)"]["median_seconds"]
    print("| run | solved | median train s | ratio to EvoTorch PGPE | median steps | median env steps |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['solved']}/{r['runs']} | {r['median_seconds']:.2f} | "
              f"{r['median_seconds'] / base:.2f} | {r['median_steps']:.0f} | {r['median_env_steps']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), "results": results}, f,
                      indent=2)


if __name__ == "__main__":
    main()
