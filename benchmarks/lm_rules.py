"""ES's update rule and three levers on a language model (issue 56): the binary race model of
``benchmarks/lm_update.py`` (``flawed``: exact answers, near 0% at the start), the same steps per run, each setting
over the task's defaults at several seeds, two runs at a time, one thread each. Resumable: a run whose
summary.json exists is not run again.

Per run: the test accuracy at the end (summary.json ``value``) and its curve, the probed sigma, steps, wall and
training seconds, generated tokens (``num_tokens``), forgetting (``drift_nll_change`` on pretraining text), the mean
``kl_penalty`` where logged, and the weights' rms change from the starting model.

    python benchmarks/lm_rules.py --out runs/rules56 --data runs/update54
    python benchmarks/lm_rules.py --out runs/rules56 --report
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import platform
import statistics
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

SETTINGS = {  # name: nesgpu train options over the generation task's defaults
    "defaults (sgd)": [],
    "adam": ["--update", "adam"],
    "subspace 0.25": ["--subspace", "0.25"],
    "subspace 0.5": ["--subspace", "0.5"],
    "beta 0.04": ["--beta", "0.04"],
    "anchor 1e-3": ["--anchor", "1e-3"],
    "adam, beta 0.04": ["--update", "adam", "--beta", "0.04"],
    # SGD's step size at the probe's usual sigma: --lr auto (sigma^2 sqrt(16) / 3 = 1.33e-4), then 2x, 4x and 8x it
    "sigma 0.01": ["--sigma", "0.01"],
    "sigma 0.01, lr x2": ["--sigma", "0.01", "--lr", "2.667e-4"],
    "sigma 0.01, lr x4": ["--sigma", "0.01", "--lr", "5.333e-4"],
    "sigma 0.01, lr x8": ["--sigma", "0.01", "--lr", "1.0667e-3"],
    "sigma 0.01, lr x2, constant": ["--sigma", "0.01", "--lr", "2.667e-4", "--lr-schedule", "constant"],
}
REWARD = "arith_reward:exact"


def slug(name: str) -> str:
    return name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")


def command(args, name: str, seed: int, run: Path) -> list[str]:
    model = args.data / "flawed"
    return [sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model", f"hf:{model / 'model'}",
            "--prompts", str(args.data / "train.jsonl"), "--eval-prompts", str(args.data / "test.jsonl"),
            "--reward", REWARD, "--correct-at", "1", "--max-new-tokens", "6", "--drift-text",
            str(model / "drift.txt"), "--steps", str(args.steps), "--eval-every", str(args.eval_every),
            "--checkpoint-every", str(args.steps), "--seed", str(seed), "--log", "none", "--out", str(run),
            "--overwrite", *SETTINGS[name]]


def one_run(args, name: str, seed: int) -> dict:
    """Run one setting at one seed (unless its summary.json exists) and collect what it measured."""
    run = args.out / "runs" / f"{slug(name)}-s{seed}"
    key = {"setting": name, "options": SETTINGS[name], "seed": seed, "run": str(run)}
    if (run / "summary.json").is_file():
        return {**key, **collect(args, run, None)}
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    start = time.perf_counter()
    done = subprocess.run(command(args, name, seed, run), env=environ, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode or not (run / "summary.json").is_file():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return {**key, "error": lines[-1] if lines else f"exit {done.returncode}, no summary.json"}
    (run / "wall_seconds.json").write_text(json.dumps(wall))
    return {**key, **collect(args, run, wall)}


def collect(args, run: Path, wall: float | None) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    if wall is None and (run / "wall_seconds.json").is_file():
        wall = json.loads((run / "wall_seconds.json").read_text())
    rows = metrics(run)
    curve = [{"step": int(r["step"]), "seconds": float(r["seconds"]), "accuracy": float(r["accuracy"]),
              "drift_nll_change": number(r.get("drift_nll_change"))} for r in rows if r.get("accuracy")]
    tokens = [number(r.get("num_tokens")) for r in rows if number(r.get("num_tokens")) is not None]
    penalty = [number(r.get("kl_penalty")) for r in rows if number(r.get("kl_penalty")) is not None]
    drift = [p["drift_nll_change"] for p in curve if p["drift_nll_change"] is not None]
    steps, seconds = summary["steps"], summary["seconds"]
    return {"accuracy": summary["value"], "start_accuracy": curve[0]["accuracy"] if curve else None,
            "sigma": summary["sigma"], "lr": summary.get("lr"), "steps": steps, "wall_seconds": wall,
            "train_seconds": seconds, "seconds_per_step": seconds / steps if steps else None,
            "tokens": max(tokens) if tokens else None, "drift_nll_change": drift[-1] if drift else None,
            "kl_penalty_mean": statistics.fmean(penalty) if penalty else None,
            **weight_change(args.data / "flawed" / "model" / "model.safetensors", run / "hf" / "model.safetensors"),
            "curve": curve}


def number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


FORMATS = {"F32": ("f", 4), "F64": ("d", 8), "F16": ("e", 2)}


def tensors(path: Path) -> dict[str, list[float]]:
    """A safetensors file's tensors as flat lists of Python floats (float64); F32, F64, F16 and BF16."""
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = body[begin:end]
        if info["dtype"] == "BF16":
            halves = struct.unpack(f"<{len(raw) // 2}H", raw)
            out[name] = list(struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I",
                                                                          *(h << 16 for h in halves))))
        elif info["dtype"] in FORMATS:
            code, width = FORMATS[info["dtype"]]
            out[name] = list(struct.unpack(f"<{len(raw) // width}{code}", raw))
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, expected one of F32, F64, F16, BF16")
    return out


def weight_change(start: Path, end: Path) -> dict:
    """The rms of (end - start) over every parameter, and that over the rms of the start."""
    if not end.is_file():
        return {"rms_change": None, "relative_rms_change": None}
    before, after = tensors(start), tensors(end)
    if set(before) != set(after):
        raise ValueError(f"{end}: tensor names differ from {start}'s")
    squares = change = count = 0.0
    for name, values in before.items():
        squares += math.fsum(v * v for v in values)
        change += math.fsum((a - b) ** 2 for a, b in zip(after[name], values))
        count += len(values)
    return {"rms_change": math.sqrt(change / count), "relative_rms_change": math.sqrt(change / squares)}


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def runs(args) -> None:
    path = args.out / "runs.jsonl"
    done = {(r["setting"], r["seed"]) for r in read(path) if "error" not in r}
    jobs = [(name, seed) for name in args.settings for seed in args.seeds if (name, seed) not in done]
    with ThreadPoolExecutor(args.parallel) as pool:
        for result in pool.map(lambda job: one_run(args, *job), jobs):
            brief = {k: v for k, v in result.items() if k != "curve"}
            print(json.dumps(brief), flush=True)
            with open(path, "a") as f:
                f.write(json.dumps(result) + "\n")
    write_results(args)


def latest(args) -> list[dict]:
    """Each (setting, seed)'s last row of runs.jsonl, a success over an error, in the settings' order."""
    rows = {}
    for r in read(args.out / "runs.jsonl"):
        key = (r["setting"], r["seed"])
        if "error" not in r or "error" in rows.get(key, {"error": ""}):
            rows[key] = r
    order = list(SETTINGS)
    return sorted(rows.values(), key=lambda r: (order.index(r["setting"]) if r["setting"] in order else 99,
                                                r["seed"]))


def write_results(args) -> None:
    machine = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in machine.splitlines() if line.startswith("Model name")),
                 platform.processor())
    results = {"benchmark": "benchmarks/lm_rules.py", "date": datetime.date.today().isoformat(),
               "machine": f"{model}, {os.cpu_count()} cores (shared with other jobs: wall times are noisy)",
               "model": str(args.data / "flawed" / "model"), "reward": REWARD, "eval_prompts": "test.jsonl",
               "steps": args.steps, "eval_every": args.eval_every, "threads_per_run": 1, "parallel": args.parallel,
               "settings": SETTINGS, "equal_time": equal_time(latest(args)), "runs": latest(args)}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n")


def at_seconds(curve: list[dict], seconds: float) -> float:
    """The accuracy at ``seconds`` on the run's clock, linear between its evaluations (its last past the end)."""
    for before, after in zip(curve, curve[1:]):
        if after["seconds"] >= seconds:
            share = (seconds - before["seconds"]) / (after["seconds"] - before["seconds"])
            return before["accuracy"] + share * (after["accuracy"] - before["accuracy"])
    return curve[-1]["accuracy"]


def equal_time(rows: list[dict]) -> dict:
    """Per seed: the shortest finished run's training seconds (its last evaluation's ``seconds``), and every
    setting's accuracy interpolated there."""
    out = {}
    for seed in sorted({r["seed"] for r in rows}):
        mine = [r for r in rows if r["seed"] == seed and r.get("curve")]
        if not mine:
            continue
        budget = min(r["curve"][-1]["seconds"] for r in mine)
        out[str(seed)] = {"seconds": budget, "accuracy": {r["setting"]: at_seconds(r["curve"], budget) for r in mine}}
    return out


def spread(values: list[float], form: str) -> str:
    if not values:
        return "-"
    middle, low, high = statistics.median(values), min(values), max(values)
    return f"{format(middle, form)} ({format(low, form)}-{format(high, form)})"


def median(values: list, form: str) -> str:
    values = [v for v in values if v is not None]
    return format(statistics.median(values), form) if values else "-"


def report(args) -> None:
    rows = latest(args)
    names = [n for n in SETTINGS if any(r["setting"] == n for r in rows)]
    print(f"{args.steps} steps, test split, seeds {sorted({r['seed'] for r in rows})}; medians over seeds\n")
    print("| setting | test accuracy median (min-max) | drift NLL rise median | weights' rms change | s/step | "
          "tokens | seeds |\n|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        good = [r for r in rows if r["setting"] == name and "error" not in r]
        bad = [r for r in rows if r["setting"] == name and "error" in r]
        errors = f" ({len(bad)} failed: {bad[0]['error'][:80]})" if bad else ""
        print(f"| {name} | {spread([r['accuracy'] for r in good], '.1%')} | "
              f"{median([r['drift_nll_change'] for r in good], '+.4f')} | "
              f"{median([r['rms_change'] for r in good], '.2e')} | "
              f"{median([r['seconds_per_step'] for r in good], '.3f')} | {median([r['tokens'] for r in good], ',.0f')} | {len(good)}{errors} |")
    timed = equal_time([r for r in rows if "error" not in r])
    if not timed:
        return
    print("\nAccuracy at equal time: per seed, each run's test-accuracy curve (its evaluations every "
          f"{args.eval_every} steps, on the run's own training clock, metrics.csv `seconds`) linearly interpolated "
          "at the shortest run's final seconds for that seed; then the median over seeds.\n")
    seeds = sorted(timed, key=int)
    print("| setting | " + " | ".join(f"seed {s} (at {timed[s]['seconds']:.0f} s)" for s in seeds) +
          " | median |\n|---|" + "---:|" * (len(seeds) + 1))
    for name in names:
        values = [timed[s]["accuracy"].get(name) for s in seeds]
        cells = " | ".join("-" if v is None else f"{v:.1%}" for v in values)
        print(f"| {name} | {cells} | {median(values, '.1%')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/rules56"))
    parser.add_argument("--data", type=Path, default=Path("runs/update54"))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--results", type=Path, default=HERE / "results" / "lm_rules_cpu.json")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.out, args.data = args.out.resolve(), args.data.resolve()
    report(args) if args.report else runs(args)


if __name__ == "__main__":
    main()
