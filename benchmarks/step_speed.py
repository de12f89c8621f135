"""Seconds per training step of two runs that the renovation must not slow down: the digits ES step (the
task's defaults: population 512, MLP 64, batch 128) and the Pendulum compiled loop (population 256, 200
env steps per episode, compile on), timed through ``nesgpu.train.train`` from metrics.csv (the steps after
the first ``--skip``, so compiling and warm-up are left out).

    python benchmarks/step_speed.py --repeats 5                 # this checkout
    python benchmarks/step_speed.py --src OTHER/src --repeats 5 # another checkout's nesgpu, same machine

Prints one JSON line per case: the median seconds per step and the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

CASES = {
    "digits ES step": dict(task="digits", steps=40),
    "pendulum compiled loop": dict(task="pendulum", steps=25, compile="on"),
}


def seconds_per_step(options: dict, skip: int) -> float:
    import csv

    from nesgpu.train import TrainConfig, train

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        steps = options["steps"]
        train(TrainConfig.flat(**options, out=str(out), log="none", eval_every=steps, checkpoint_every=steps,
                          progress_every=0.0, device="cpu"), log=lambda *a, **k: None)
        rows = list(csv.DictReader(open(out / "metrics.csv")))
    times = [float(r["seconds"]) for r in rows]
    # the last step also evaluates and checkpoints: time the steps from skip up to the one before it
    return (times[-2] - times[skip - 1]) / (len(times) - 1 - skip)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="put this directory first on sys.path (another checkout's src/)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", type=int, default=5, help="steps left out at the start (compiling, warm-up)")
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, args.src)
    import torch

    torch.set_num_threads(torch.get_num_threads())
    for name, options in CASES.items():
        runs = [seconds_per_step(options, args.skip) for _ in range(args.repeats)]
        print(json.dumps({"case": name, "median_s_per_step": statistics.median(runs), "runs": runs,
                          "src": args.src or "this checkout"}), flush=True)


if __name__ == "__main__":
    main()
