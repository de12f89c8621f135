"""ES and backprop trained to the end of their step counts on one task: final metric and wall time per seed.

``nesgpu compare`` gives both sides the same seconds; this gives each side its whole run (the task's
``--steps`` by default) and reports the accuracy each reaches and the seconds it took. Both sides build
the same model from the same seed and see the same minibatch stream. The ES side takes the task's defaults
or a YAML of options (e.g. a tune's best.yaml); the backprop side AdamW's defaults or a YAML.

Run:
    python benchmarks/es_vs_backprop.py [--task digits] [--model cnn] [--seeds 0 1 2]
        [--es-config best.yaml] [--es-steps N] [--backprop-config bp.yaml] [--backprop-steps N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from nesgpu.train import TrainConfig, train

DROP = ("out", "seed", "log")  # set per run here


def run(values: dict, seed: int, root: Path) -> dict:
    cfg = TrainConfig.from_dict({**values, "seed": seed, "log": "none",
                                 "out": str(root / f"{values.get('strategy') or 'es'}-{seed}")})
    return train(cfg, log=lambda *a, **k: None)


def load(path: str | None) -> dict:
    if path is None:
        return {}
    values = TrainConfig.read_yaml(path)
    return {k: v for k, v in values.items() if k not in DROP}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits")
    parser.add_argument("--model", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--es-config", help="YAML of the ES side's options (default: the task's)")
    parser.add_argument("--backprop-config", help="YAML of the backprop side's options (default: AdamW's)")
    parser.add_argument("--es-steps", type=int, help="ES steps (default: the config's, else the task's)")
    parser.add_argument("--backprop-steps", type=int, help="backprop steps (default: the ES side's steps)")
    args = parser.parse_args()
    es = {"task": args.task, "model": args.model, "device": "cpu", **load(args.es_config)}
    if args.es_steps:
        es["steps"] = args.es_steps
    es_resolved = TrainConfig.from_dict(es).resolved()
    bp = {"task": args.task, "model": es_resolved.model, "hidden": es_resolved.hidden,
          "batch_size": es_resolved.option("batch_size"), "device": "cpu", "strategy": "backprop",
          "steps": args.backprop_steps or es_resolved.steps, **load(args.backprop_config)}
    rows = {"es": [], "backprop": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # alternate the sides, so machine load hits both alike
            rows["es"].append(run(es, seed, Path(tmp)))
            rows["backprop"].append(run(bp, seed, Path(tmp)))
    print(f"{args.task} ({es_resolved.model}, hidden {es_resolved.hidden}), seeds {args.seeds}, "
          f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| side | strategy | steps | final metric per seed | mean | wall time per seed (s) | median s |")
    print("|---|---|---:|---|---:|---|---:|")
    for side, runs in rows.items():
        values = [r["value"] for r in runs]
        seconds = [r["seconds"] for r in runs]
        print(f"| {side} | {runs[0]['strategy']} | {runs[0]['steps']} | {', '.join(f'{v:.4f}' for v in values)} | "
              f"{statistics.mean(values):.4f} | {', '.join(f'{s:.1f}' for s in seconds)} | "
              f"{statistics.median(seconds):.1f} |")


if __name__ == "__main__":
    main()
