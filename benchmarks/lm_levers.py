"""The levers of ES on a language model, one at a time, on the race's work (benchmarks/lm_vs_grpo.py): the
same pretrained model, train prompts, reward function and budget, each setting scored on the validation split
by the race's one function (a fresh copy of the final weights). Two runs at a time, one thread each.

For each setting: the validation accuracy at the end, the mean share of prompts whose rewards differ across
members (a prompt without any carries no signal), the steps, and the generated tokens; every curve goes to
``levers.json``.

    python benchmarks/lm_levers.py --out runs/race --model last-digit --seconds 120
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_vs_grpo import MODELS, es_result, es_run, prepare, score  # noqa: E402  (this folder's)

LEVERS = {  # name: nesgpu train options over the task's defaults
    "greedy (defaults)": [],
    "sampled, T 0.7": ["--temperature", "0.7"],
    "sampled, T 0.7, 4 per prompt, 2 prompts": ["--temperature", "0.7", "--generations", "4", "--batch-size", "2"],
    "more directions: population 128, 2 prompts": ["--population", "128", "--batch-size", "2"],
    "rank 4 noise": ["--rank", "4"],
    "evolve matrices": ["--evolve", "matrices"],
    # a schedule runs over --steps: 1,000 is about what 120 s reaches here (the race's runs say 1,000,000)
    "sigma decays to 0.3x over 1,000 steps": ["--sigma-schedule", "cosine", "--sigma-final", "0.3", "--steps", "1000"],
    "lr decays to 0.1x over 1,000 steps": ["--lr-schedule", "cosine", "--lr-final", "0.1", "--steps", "1000"],
    "likelihood, T 1, 8 per prompt": ["--fitness", "likelihood", "--temperature", "1", "--generations", "8"],
    "likelihood, T 0.7, 8 per prompt": ["--fitness", "likelihood", "--temperature", "0.7", "--generations", "8"],
    "likelihood, T 1, 8 per prompt, sigma 0.01, lr 3e-4": ["--fitness", "likelihood", "--temperature", "1",
                                                           "--generations", "8", "--sigma", "0.01", "--lr", "3e-4"],
    "likelihood, T 0.7, 8 per prompt, 16 prompts": ["--fitness", "likelihood", "--temperature", "0.7",
                                                     "--generations", "8", "--batch-size", "16"],
    "IID Gaussian noise": ["--layer", "gaussian"],
    "z-score shaping": ["--shaping", "z_score"],
    "32 prompts per step": ["--batch-size", "32"],
    "more directions: population 128, 8 prompts": ["--population", "128"],
    # ES at Scale's update: plain SGD on reward-normalised differences (ARS with every direction)
    "SGD on normalised rewards (ARS), lr 4e-4": ["--strategy", "ars", "--lr", "4e-4"],
    "SGD on normalised rewards (ARS), lr 1e-3": ["--strategy", "ars", "--lr", "1e-3"],
    "ARS, top half of directions, lr 4e-4": ["--strategy", "ars", "--lr", "4e-4", "--top-b", "8"],
}


def spread(run: Path) -> float:
    """The mean over the run's steps of the share of prompts with any spread."""
    with open(run / "metrics.csv", newline="") as f:
        values = [float(r["prompts_with_spread"]) for r in csv.DictReader(f) if r.get("prompts_with_spread")]
    return statistics.fmean(values) if values else float("nan")


SCORING = threading.Lock()  # transformers' lazy imports are not thread-safe; scoring is short


def one(args, name: str, setting: list[str]) -> dict:
    """The lever's run (or, with --reuse, its finished run of an earlier call), scored on validation."""
    work = args.out / args.model / "levers" / name.replace(" ", "_").replace(",", "")
    work.mkdir(parents=True, exist_ok=True)
    done = work / "es-seed0"
    if args.reuse and (done / "summary.json").is_file():
        run = es_result(done)
    else:
        run = es_run(args, work, args.out / args.model / "model", setting, 0, "val")
    with SCORING:
        value = score(run["weights"], args.out / "val.jsonl")
    return {"lever": name, "setting": setting, **run, "spread": spread(Path(run["weights"]).parent),
            "score": value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/race"))
    parser.add_argument("--model", default="last-digit", choices=list(MODELS))
    parser.add_argument("--levers", nargs="+", default=list(LEVERS), choices=list(LEVERS))
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--eval-seconds", type=float, default=20)
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true", help="score a lever's finished run instead of rerunning it")
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.models = [args.model]
    prepare(args, args.out)
    start = score(str(args.out / args.model / "model"), args.out / "val.jsonl")
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda name: one(args, name, LEVERS[name]), args.levers))
    (args.out / args.model / "levers.json").write_text(json.dumps(results, indent=1))
    print(f"\n{args.model}: validation accuracy before fine-tuning {start:.1%}, {args.seconds:.0f} s each\n")
    print("| lever | options | validation accuracy | prompts with spread | steps | generated tokens |\n"
          "|---|---|---:|---:|---:|---:|")
    for r in results:
        end = r["curve"][-1]
        print(f"| {r['lever']} | `{' '.join(r['setting']) or 'defaults'}` | {r['score']:.1%} | {r['spread']:.2f} | "
              f"{end['iteration']} | {end['tokens']:,} |")


if __name__ == "__main__":
    main()
