"""nesgpu's ES, TRL's GRPO and the ES-at-Scale baseline on the same work, side by side: the demo's
pretrained small Llama (examples/lm_reward_demo.py), the arithmetic task's prompts, reward and held-out
split, and one wall-clock budget per run, for several seeds. Prints a table (held-out accuracy at the end of
the budget, median over seeds, with the spread; generated tokens; peak memory) and writes every curve as JSON.

GRPO runs in its own environment with ``trl`` (``--trl-python``); the others in this one. ``--jobs 2`` runs
two runs at a time, each with ``--threads`` threads (the same for every method).

    python benchmarks/lm_vs_grpo.py --out runs/lm-vs-grpo --seconds 120 --seeds 0 1 2 --trl-python TRLENV/bin/python
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
from lm_reward_demo import corpus, pretrain, train_tokenizer  # noqa: E402


def es_run(args, out: Path, seed: int) -> dict:
    """nesgpu train on the task for the budget; the curve from metrics.csv (tokens = rows x new tokens)."""
    run = out / f"es-{seed}"
    command = [sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--model", f"hf:{out / 'model'}",
               "--time-budget", str(args.seconds), "--steps", "1000000", "--eval-seconds", str(args.eval_seconds),
               "--seed", str(seed), "--out", str(run), "--overwrite", "--log", "none", *args.es_args.split()]
    result = subprocess.run(["/usr/bin/time", "-f", "%M", *command], capture_output=True, text=True, env=env(args))
    if result.returncode:
        raise RuntimeError(f"ES seed {seed} failed: {result.stderr[-2000:]}")
    config = json.loads((run / "config.json").read_text())
    rows_per_step = config["population"] * config["batch_size"] * 6  # members x prompts x new tokens
    with open(run / "metrics.csv", newline="") as f:
        curve = [{"seconds": float(r["seconds"]), "iteration": int(r["step"]), "accuracy": float(r["accuracy"]),
                  "tokens": int(r["step"]) * rows_per_step} for r in csv.DictReader(f) if r["accuracy"]]
    return {"method": "nesgpu_es", "seed": seed, "curve": curve,
            "peak_rss_mib": int(result.stderr.strip().splitlines()[-1]) / 1024}


def script_run(args, out: Path, seed: int, method: str) -> dict:
    """The GRPO or ES-at-Scale script for the budget; its JSON."""
    path = out / f"{method}-{seed}.json"
    python, script = ((args.trl_python, "lm_grpo.py") if method == "grpo" else (sys.executable, "lm_es_at_scale.py"))
    command = [python, str(HERE / script), "--model", str(out / "model"), "--seconds", str(args.seconds),
               "--eval-seconds", str(args.eval_seconds), "--seed", str(seed), "--json", str(path)]
    result = subprocess.run(command, capture_output=True, text=True,
                            env=env(args, PYTHONPATH=str(HERE.parent / "src")))
    if result.returncode:
        raise RuntimeError(f"{method} seed {seed} failed: {result.stderr[-2000:]}")
    return json.loads(path.read_text())


def env(args, **extra) -> dict:
    threads = str(args.threads)
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, **extra}


def prepare(args, out: Path) -> None:
    if (out / "model" / "config.json").is_file():
        return
    lines = corpus(0.5, seed=0)
    tokenizer = train_tokenizer(lines)
    model = pretrain(tokenizer, lines, args.pretrain_steps, seed=0)
    model.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")


def table(results: list[dict]) -> None:
    print("| method | held-out accuracy at the start | at the end of the budget (median, min-max) | steps | "
          "generated tokens | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    starts = [r["curve"][0]["accuracy"] for r in results if r["curve"][0]["iteration"] == 0]  # one model
    start = starts[0] if starts else float("nan")
    for method in dict.fromkeys(r["method"] for r in results):
        runs = [r for r in results if r["method"] == method]
        end = [r["curve"][-1]["accuracy"] for r in runs]
        print(f"| {method} | {start:.1%} | {statistics.median(end):.1%} ({min(end):.1%}-{max(end):.1%}) | "
              f"{statistics.median(r['curve'][-1]['iteration'] for r in runs):.0f} | "
              f"{statistics.median(r['curve'][-1]['tokens'] for r in runs):,.0f} | "
              f"{statistics.median(r['peak_rss_mib'] for r in runs):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/lm-vs-grpo")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--eval-seconds", type=float, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=["nesgpu_es", "grpo", "es_at_scale"])
    parser.add_argument("--trl-python", default="python", help="a python with trl installed")
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--es-args", default="", help="more nesgpu train options")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prepare(args, out)
    work = [(m, s) for s in args.seeds for m in args.methods]

    def one(item):
        method, seed = item
        return es_run(args, out, seed) if method == "nesgpu_es" else script_run(args, out, seed, method)

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, work))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table(results)


if __name__ == "__main__":
    main()
