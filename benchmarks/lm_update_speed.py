"""A step's wall time by update (issue 54): ``--update sgd`` and ``adam`` (in place) against ``strategy`` (Adam over
``.grad``, float32 masters for half-precision weights, the update before issue 54), on a race model of
benchmarks/lm_vs_grpo.py, at a fixed sigma and lr (no probe), one thread. The updates run in turn, repeat after
repeat, so that a machine's load falls on each alike; each run's seconds per step is its last row's ``seconds``
over its steps (the step-0 evaluation excluded), and the table gives each update's median over the repeats and its
ratio to ``strategy``'s.

    python benchmarks/lm_update_speed.py --model runs/update54/flawed/model --data runs/update54 --steps 40
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
UPDATES = ("strategy", "sgd", "adam")


def seconds_per_step(args, update: str, repeat: int) -> float:
    run = args.out / f"{update}-{repeat}"
    command = [sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model", f"hf:{args.model}",
               "--prompts", str(args.data / "train.jsonl"), "--reward", "arith_reward:exact", "--max-new-tokens", "6",
               "--steps", str(args.steps), "--sigma", "0.01", "--lr", "1e-4", "--update", update, "--dtype",
               args.dtype, "--eval-every", str(args.steps), "--checkpoint-every", str(args.steps), "--log", "none",
               "--progress-every", "0", "--out", str(run), "--overwrite"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode:
        raise RuntimeError(f"{update}: {result.stderr[-2000:]}")
    with open(run / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["step"] != "0"]
    return (float(rows[-1]["seconds"]) - float(rows[0]["seconds"])) / (len(rows) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="lm_vs_grpo.py's OUT (train.jsonl)")
    parser.add_argument("--out", type=Path, default=Path("runs/update_speed"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    times = {update: [] for update in UPDATES}
    for repeat in range(args.repeats):
        for update in UPDATES:
            times[update].append(seconds_per_step(args, update, repeat))
    base = statistics.median(times["strategy"])
    print(f"| update ({args.dtype}) | s/step (median of {args.repeats}) | vs strategy |\n|---|---:|---:|")
    for update in UPDATES:
        median = statistics.median(times[update])
        print(f"| {update} | {median:.4f} | {median / base:.3f}x |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seconds": times},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
