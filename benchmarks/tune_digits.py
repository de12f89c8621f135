"""nesgpu tune on digits: does a time-boxed search beat the shipped defaults at a shortened step count?

1. ``nesgpu tune --task digits --steps S --timeout T`` with the default search space of openai_es (lr, sigma
   log-uniform 10x either side of the presets, population, weight_decay, rank, hidden sizes).
2. The shipped default config and the tune's best.yaml, each trained again from scratch with the same steps
   and seed, side by side in a markdown table.

The comparison is on the digits test split, which the tune also scores its trials on, so the tuned number
is optimistic by the selection among its trials; the re-run shows that the best trial reproduces. The tuned
config may use more compute per step (a larger population or model): the table gives each run's seconds.

Run: python benchmarks/tune_digits.py [--timeout 600] [--steps 200] [--seed 0] [--out runs/tune_digits]
(a smoke run: --timeout 60 --steps 50)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

from nesgpu.cli import main as nesgpu
from nesgpu.train import TrainConfig, train

SHOWN = ("lr", "sigma", "population", "hidden", "weight_decay", "layer_options")


def quiet(*args, **kwargs) -> None:
    pass


def rerun(cfg: TrainConfig, out: Path) -> dict:
    """Train ``cfg`` from scratch in ``out``; its summary."""
    return train(dataclasses.replace(cfg, out=str(out)), log=quiet, overwrite=True)


def row(name: str, cfg: TrainConfig, summary: dict) -> str:
    values = [f"{summary['value']:.4f}", f"{summary['seconds']:.1f}"]
    values += [",".join(map(str, v)) if isinstance(v, tuple) else
               (f"{v:.3g}" if isinstance(v, float) else str(v)) for v in (getattr(cfg, k) for k in SHOWN)]
    return f"| {name} | " + " | ".join(values) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds of tuning (default: 600)")
    parser.add_argument("--steps", type=int, default=200, help="steps of every run (default: 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=1000, help="cap on the trials (default: 1000)")
    parser.add_argument("--sampler", default="tpe", choices=("tpe", "gp", "cmaes"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="runs/tune_digits", help="the tune directory (replaced)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    common = ["--task", "digits", "--steps", str(args.steps), "--seed", str(args.seed), "--device", args.device,
              "--log", "none"]
    status = nesgpu(["tune", *common, "--timeout", str(args.timeout), "--trials", str(args.trials), "--sampler",
                     args.sampler, "--out", str(out)])
    if status != 0 or not (out / "best.yaml").is_file():
        sys.exit(f"the tune ended with status {status} and no best.yaml")

    default = TrainConfig(task="digits", steps=args.steps, seed=args.seed, device=args.device, log="none").resolved()
    best = TrainConfig.from_yaml(out / "best.yaml").resolved()
    results = {"default": rerun(default, out / "rerun-default"), "tuned": rerun(best, out / "rerun-best")}
    trials = sum(1 for _ in (out / "trials").iterdir())

    print(f"\ndigits, {args.steps} steps, seed {args.seed}; tune: {trials} trials in {args.timeout:.0f} s "
          f"({args.sampler})\n")
    print("| config | test_accuracy | seconds | " + " | ".join(SHOWN) + " |")
    print("|---" * (3 + len(SHOWN)) + "|")
    print(row("shipped default", default, results["default"]))
    print(row("tuned (best.yaml)", best, results["tuned"]))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "steps": args.steps, "seed": args.seed, "timeout": args.timeout, "trials": trials,
            "sampler": args.sampler,
            "default": {"config": json.loads(default.to_json()), "summary": results["default"]},
            "tuned": {"config": json.loads(best.to_json()), "summary": results["tuned"]}}, indent=2))


if __name__ == "__main__":
    main()
