"""A small transformer trained two ways on the same sequence task: ES (nesgpu's trainer) vs autograd + AdamW.

Both sides start from the same initial weights (the trainer's seeded ``make_model``), see the same
minibatch stream (``task.batch(step)``, a function of (seed, step)) and are evaluated on the same held-out
strings every ``--eval-every`` steps. Reported per side and seed: final token and sequence accuracy, the
wall time of the whole run (periodic evaluations included, the same rule for both), and the seconds and
steps until the test token accuracy first reached ``--target``.

``--mode mnist1d-cnn`` instead trains the Conv1d classifier on MNIST-1D (ES with the task's defaults for
``--model cnn``, and AdamW on the same network for reference).

Run:
    python benchmarks/transformer_es_vs_adamw.py [--task reverse] [--seeds 0 1 2] [--json PATH]
    python benchmarks/transformer_es_vs_adamw.py --mode mnist1d-cnn [--seeds 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nesgpu.tasks import make_task
from nesgpu.train import TrainConfig, train
from nesgpu.train.setup.build import build
from nesgpu.train.storage.checkpoint import load_weights


def accuracies(task, model) -> dict:
    """Token and sequence accuracy for a sequence task, test accuracy for a classifier."""
    model.eval()
    if hasattr(task, "accuracies"):
        return task.accuracies(model)
    return {"test_accuracy": task.evaluate(model)}


def loss_of(task, model, x, y) -> torch.Tensor:
    if hasattr(task, "token_losses"):
        return task.token_losses(model(x), y).mean()
    return F.cross_entropy(model(x), y)


def first_reaching(curve: list[tuple[int, float, float]], target: float) -> dict:
    """The first (step, seconds) of an evaluation curve [(step, seconds, accuracy)] at or above target."""
    for step, seconds, value in curve:
        if value >= target:
            return {"steps_to_target": step, "seconds_to_target": round(seconds, 2)}
    return {"steps_to_target": None, "seconds_to_target": None}


def adamw_run(cfg: TrainConfig, steps: int, lr: float, eval_every: int, target: float) -> dict:
    """Plain torch: the config's task and initial model, AdamW on the same minibatches."""
    task = make_task(cfg.task, device="cpu", seed=cfg.seed, batch_size=cfg.option("batch_size"))
    with torch.random.fork_rng(devices=[]):  # the ES run's initial weights: the trainer seeds make_model so
        torch.manual_seed(cfg.seed)
        model = task.make_model(cfg.hidden, model=cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    curve, start = [], time.perf_counter()
    for step in range(1, steps + 1):
        x, y = task.batch(step)
        loss = loss_of(task, model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % eval_every == 0 or step == steps:
            curve.append((step, time.perf_counter() - start, task.evaluate(model)))
    seconds = time.perf_counter() - start
    return {"steps": steps, "seconds": round(seconds, 2), "lr": lr, **accuracies(task, model),
            **first_reaching(curve, target)}


def es_run(cfg: TrainConfig, target: float) -> dict:
    """nesgpu's trainer with the config; accuracies of the saved model."""
    summary = train(cfg, log=lambda *a, **k: None)
    cfg = cfg.resolved()
    task, model, _, _ = build(cfg, torch.device("cpu"))
    load_weights(model, Path(cfg.out) / "model.safetensors")
    with open(Path(cfg.out) / "metrics.csv", newline="") as f:
        curve = [(int(r["step"]), float(r["seconds"]), float(r["test_accuracy"]))
                 for r in csv.DictReader(f) if r["test_accuracy"]]
    return {"steps": cfg.steps, "seconds": summary["seconds"], "population": cfg.population, "sigma": cfg.sigma,
            "lr": cfg.lr, "layer": cfg.layer, "strategy": cfg.strategy, "hidden": list(cfg.hidden),
            "batch_size": cfg.option("batch_size"), **accuracies(task, model), **first_reaching(curve, target)}


def median(runs: list[dict]) -> dict:
    """Median of every numeric entry over seeds (None where some run has none, e.g. never reached the target)."""
    keys = [k for k, v in runs[0].items() if k != "seed" and (v is None or isinstance(v, (int, float)))
            and not isinstance(v, bool)]
    out = {}
    for k in keys:
        values = [r[k] for r in runs if r.get(k) is not None]
        out[k] = statistics.median(values) if len(values) == len(runs) else None
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["transformer", "mnist1d-cnn"], default="transformer")
    parser.add_argument("--task", default="reverse", help="transformer mode: reverse | sort")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--es-steps", type=int, help="ES steps (default: the task's)")
    parser.add_argument("--adamw-steps", type=int, default=None, help="default: 500 (transformer), 3000 (cnn)")
    parser.add_argument("--adamw-lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--target", type=float, default=None, help="accuracy to time (default 0.95 / 0.90)")
    parser.add_argument("--skip-adamw", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    task_name, model = (args.task, None) if args.mode == "transformer" else ("mnist1d", "cnn")
    target = args.target if args.target is not None else (0.95 if args.mode == "transformer" else 0.90)
    adamw_steps = args.adamw_steps or (500 if args.mode == "transformer" else 3000)
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {"es": [], "adamw": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            cfg = TrainConfig(task=task_name, model=model, seed=seed, device="cpu", steps=args.es_steps,
                              eval_every=args.eval_every, out=f"{tmp}/es{seed}")
            run = es_run(cfg, target)
            print(f"ES     seed {seed}: {json.dumps(run)}", flush=True)
            results["es"].append({"seed": seed, **run})
            if not args.skip_adamw:
                run = adamw_run(cfg.resolved(), adamw_steps, args.adamw_lr, args.eval_every, target)
                print(f"AdamW  seed {seed}: {json.dumps(run)}", flush=True)
                results["adamw"].append({"seed": seed, **run})
    report = {
        "command": " ".join(["python", *sys.argv]), "date": time.strftime("%Y-%m-%d"), "mode": args.mode,
        "task": task_name, "model": model or "transformer",
        "target": target, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "loadavg_before": [round(v, 2) for v in load_before], "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        "median": {side: median(runs) for side, runs in results.items() if runs}, "runs": results,
    }
    print(json.dumps(report["median"], indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
