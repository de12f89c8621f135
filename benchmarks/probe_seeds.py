"""Does ``--sigma auto`` hold on every seed (issue 56)? For each language model, batch size and seed: the sigma the
probe chooses and what it measured at every candidate of its grid (``--survey``), and the held-out accuracy of a
run at the probed sigma against runs at fixed sigmas, the same steps, ``--lr auto`` everywhere (so sigma is the
only difference), two runs at a time, one thread each.

    python benchmarks/probe_seeds.py --out runs/probe56 --data runs/update54 --survey
    python benchmarks/probe_seeds.py --out runs/probe56 --data runs/update54 --steps 400
    python benchmarks/probe_seeds.py --out runs/probe56new --report --before runs/probe56

``--data`` holds train.jsonl, val.jsonl and the models (``flawed/model``, ``last-digit/model``: made by
``benchmarks/lm_update.py``, which builds them as ``lm_vs_grpo.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODELS = {"flawed": "arith_reward:exact", "last-digit": "arith_reward:correct",  # binary, near 0%; dense, ~25%
          "flawed-first": "arith_reward:exact"}  # binary, near 0% (its teacher wrong in the first digit)
FIXED = (0.00178, 0.00316, 0.0056, 0.01, 0.0178, 0.0316)


def command(args, model: str, batch: int, seed: int, sigma: str, run: Path) -> list[str]:
    return [sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model",
            f"hf:{args.data / model / 'model'}", "--prompts", str(args.data / "train.jsonl"), "--eval-prompts",
            str(args.data / "val.jsonl"), "--reward", MODELS[model], "--correct-at", "1", "--max-new-tokens", "6",
            "--steps", str(args.steps), "--eval-every", str(args.steps), "--checkpoint-every", str(args.steps),
            "--batch-size", str(batch), "--seed", str(seed), "--sigma", sigma, "--log", "none", "--out", str(run),
            "--overwrite"]


def one_run(args, model: str, batch: int, seed: int, sigma: str) -> dict:
    run = args.out / "runs" / f"{model}-b{batch}-s{seed}-{sigma}"
    paths = [str(args.src)] if args.src else []  # another checkout's nesgpu, to measure it
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([*paths, str(HERE)])}
    done = subprocess.run(command(args, model, batch, seed, sigma, run), env=environ, capture_output=True, text=True)
    if done.returncode:
        return {"model": model, "batch": batch, "seed": seed, "setting": sigma, "error": done.stderr[-400:]}
    summary = json.loads((run / "summary.json").read_text())
    return {"model": model, "batch": batch, "seed": seed, "setting": sigma, "sigma": summary["sigma"],
            "accuracy": summary["value"], "start": start_accuracy(run),
            "no_signal": summary.get("steps_without_signal"), "note": summary.get("sigma_probe", {}).get("note", "")}


def start_accuracy(run: Path) -> float | None:
    """The held-out accuracy at step 0, where metrics.csv has it (the first evaluation)."""
    import csv
    with open(run / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("accuracy")]
    return float(rows[0]["accuracy"]) if rows and rows[0]["step"] == "0" else None


def runs(args) -> None:
    jobs = [(m, b, s, sigma) for m in args.models for b in args.batches for s in args.seeds
            for sigma in ["auto", *(f"{x:g}" for x in args.fixed)]]
    path = args.out / "runs.jsonl"
    done = {(r["model"], r["batch"], r["seed"], r["setting"]) for r in read(path)}
    with ThreadPoolExecutor(args.parallel) as pool:
        for result in pool.map(lambda job: one_run(args, *job), [j for j in jobs if j not in done]):
            print(json.dumps(result), flush=True)
            with open(path, "a") as f:
                f.write(json.dumps(result) + "\n")


def survey(args) -> None:
    """Every grid candidate's measurements (the probe's own, from :func:`nesgpu.probe.measure_reward`)."""
    import torch

    from nesgpu.probe import FLOOR, GRID, probe_sigma, reward_trial
    from nesgpu.train.setup.build import build
    from nesgpu.train.setup.config import TrainConfig

    torch.set_num_threads(1)
    path = args.out / "survey.jsonl"
    for model in args.models:
        for batch in args.batches:
            for seed in args.seeds:
                cfg = TrainConfig.flat(task="generation", model=f"hf:{args.data / model / 'model'}",
                                  prompts=str(args.data / "train.jsonl"), eval_prompts=str(args.data / "val.jsonl"),
                                  reward=MODELS[model], correct_at=1, max_new_tokens=6, seed=seed, batch_size=batch,
                                  log="none", out=str(args.out / "survey-run")).resolved()
                built = build(cfg, torch.device("cpu"), log=lambda *a, **k: None)
                population, task = built.step.population, built.task
                plain = population.evaluate(task, 1, FLOOR, finish=False, shape=False).fitness
                grid = [reward_trial(population.evaluate(task, 1, s, finish=False, shape=False).fitness, plain,
                                     2, s) for s in GRID]
                chosen = probe_sigma(population, task)
                row = {"model": model, "batch": batch, "seed": seed, "grid": grid, "chosen": chosen.sigma,
                       "note": chosen.note}
                print(json.dumps(row), flush=True)
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def report(args) -> None:
    """Per (model, batch, seed): the probed sigma and its accuracy (and, with ``--before DIR``, those of DIR's auto
    runs: an earlier probe), the best fixed sigma of either directory, and the share of the best's gain."""
    now = [r for r in read(args.out / "runs.jsonl") if "accuracy" in r]
    before = [r for r in read(args.before / "runs.jsonl") if "accuracy" in r] if args.before else []
    fixed = [r for r in now + before if r["setting"] != "auto"]
    print("| model | prompts per step | seed | before: sigma, accuracy | probed sigma | its accuracy | best fixed "
          "sigma | its accuracy | share of the best's gain |\n|---|---:|---:|---|---:|---:|---:|---:|---:|")
    shares = {}
    for key in sorted({(r["model"], r["batch"], r["seed"]) for r in now if r["setting"] == "auto"}):
        auto = next(r for r in now if r["setting"] == "auto" and (r["model"], r["batch"], r["seed"]) == key)
        mine = [r for r in fixed if (r["model"], r["batch"], r["seed"]) == key]
        if not mine:
            continue
        old = next((r for r in before if r["setting"] == "auto" and (r["model"], r["batch"], r["seed"]) == key), None)
        best = max(mine, key=lambda r: (r["accuracy"], -r["sigma"]))
        start = auto["start"] or 0.0
        share = (auto["accuracy"] - start) / (best["accuracy"] - start) if best["accuracy"] > start else float("nan")
        shares.setdefault(key[:2], []).append(share)
        was = f"{old['sigma']:.3g}, {old['accuracy']:.1%}" if old else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {was} | {auto['sigma']:.3g} | {auto['accuracy']:.1%} | "
              f"{best['sigma']:.3g} | {best['accuracy']:.1%} | {share:.2f} |")
    for (model, batch), values in sorted(shares.items()):
        print(f"\n{model}, {batch} prompts per step: share of the best fixed sigma's gain, min {min(values):.2f}, "
              f"median {statistics.median(values):.2f} over {len(values)} seeds")
    by = {}
    for r in fixed:
        by.setdefault((r["model"], r["batch"], r["sigma"]), []).append(r["accuracy"])
    print("\n| model | prompts per step | fixed sigma | median accuracy over seeds | seeds |\n|---|---:|---:|---:|---:|")
    for key in sorted(by):
        print(f"| {key[0]} | {key[1]} | {key[2]:g} | {statistics.median(by[key]):.1%} | {len(by[key])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/probe56"))
    parser.add_argument("--data", type=Path, default=Path("runs/update54"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--fixed", type=float, nargs="*", default=list(FIXED))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--src", type=Path, help="run this nesgpu source tree (its src/), not the installed one")
    parser.add_argument("--survey", action="store_true", help="the grid's measurements only, no training")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--before", type=Path, help="with --report: a directory of an earlier probe's runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.out, args.data = args.out.resolve(), args.data.resolve()
    report(args) if args.report else survey(args) if args.survey else runs(args)


if __name__ == "__main__":
    main()
