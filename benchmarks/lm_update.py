"""Optimizer state only where it pays (issue 54): ``--update sgd`` (plain SGD on the ES estimate, written into the
weights in place: no .grad, no Adam state) against ``--update strategy`` (OpenAI-ES's estimate into .grad, stepped
by Adam), on the language-model race of benchmarks/lm_vs_grpo.py, each run beside the other at the same time.

For each pretrained small Llama (``flawed``: binary, near 0% before fine-tuning; ``last-digit``), on the arithmetic
prompts and the races' rewards (``benchmarks/arith_reward.py``: ``flawed`` the binary ``exact``, the others the
dense ``correct``, :data:`REWARDS`):

1. tuning: each update tries the same number of settings (:data:`SETTINGS`) of its own main options, seed 0, one
   budget each, sgd setting i beside strategy setting i (one thread each); each scored on the validation split with
   lm_vs_grpo.py's :func:`score`. ``strategy``'s are the race's first four ES settings with ``--update strategy``;
   ``sgd``'s second and last are a third of the sigma its first (default) run probed (``--lr auto`` then gives
   a ninth of the lr) and twice the lr that ``--lr auto`` gave that run;
2. the best setting of each runs every seed on the test split, side by side, the same budget; each final model's
   test accuracy (``score``), steps, and forgetting: lm_drift.py's :func:`final_measures` against the starting
   model on held-out pretraining text (``OUT/MODEL/drift.txt``, lm_drift.py's ``write_drift_texts``).

    python benchmarks/lm_update.py --out runs/update54 --seconds 120
    python benchmarks/lm_update.py --out runs/update54 --report
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE)]
from lm_drift import final_measures, write_drift_texts  # noqa: E402
from lm_vs_grpo import REWARD, SETTINGS as RACE, es_run, prepare, race_parser, score  # noqa: E402

TWICE_AUTO = "2x-auto"  # placeholder: twice the lr that sgd's default run took at its probed sigma
THIRD_SIGMA = "sigma/3"  # placeholder: a third of the sigma that sgd's default run probed (lr auto from it: 1/9)
SETTINGS = {  # the same number per update, over its own main options; the first is each one's default
    "sgd": [["--update", "sgd"], ["--update", "sgd", "--sigma", THIRD_SIGMA],
            ["--update", "sgd", "--population", "64", "--batch-size", "4"], ["--update", "sgd", "--lr", TWICE_AUTO]],
    "strategy": [[*s, "--update", "strategy"] for s in RACE["nesgpu_es"][:4]],
}
COMMON = ["--dtype", "float32"]
# each model's training reward, as in the races: `flawed` on the binary one (issue 43's binary race), the others
# on the dense one (exact answer 1, another integer 0.1); scoring is always the exact-answer accuracy
REWARDS = {"flawed": "arith_reward:exact"}


def metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def resolve(setting: list[str], tuning: list[dict]) -> list[str]:
    """The setting with TWICE_AUTO replaced by twice the lr of sgd's default tuning run (its first step), and
    THIRD_SIGMA by a third of the sigma it probed."""
    if TWICE_AUTO not in setting and THIRD_SIGMA not in setting:
        return setting
    base = next(r for r in tuning if r["method"] == "sgd" and r["setting"] == SETTINGS["sgd"][0])
    values = {TWICE_AUTO: f"{2 * base['lr_start']:.3g}", THIRD_SIGMA: f"{base['sigma'] / 3:.3g}"}
    return [values.get(s, s) for s in setting]


def side_by_side(args, name: str, work: Path, settings: dict, seed: int, split: str) -> list[dict]:
    """An sgd run and a strategy run at the same time (one thread each), each scored on ``split``, with its
    forgetting (lm_drift.py's final_measures against the starting model)."""
    model = args.out / name / "model"
    for method in settings:
        (work / method).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda m: es_run(args, work / m, model, [*settings[m], *COMMON], seed, split), settings))
    drift = argparse.Namespace(out=args.out / name, model=model)
    out = []
    for method, run in zip(settings, done):
        rows = [r for r in metrics(work / method / f"es-seed{seed}") if r["sigma"]]  # the steps' rows
        out.append({"method": method, "setting": settings[method], "seed": seed, "split": split,
                    "steps": int(rows[-1]["step"]), "sigma": float(rows[0]["sigma"]),
                    "lr_start": float(rows[0]["lr"]), "lr_end": float(rows[-1]["lr"]), **run,
                    "score": score(run["weights"], args.out / f"{split}.jsonl"),
                    **final_measures(drift, run["weights"])})
    return out


def race(args, name: str, results: list[dict], save) -> dict:
    """Tuning on the validation split (seed 0), then each update's best setting on the test split, per seed;
    what ``results`` already holds of this model is kept."""
    model = args.out / name / "model"
    args = argparse.Namespace(**{**vars(args), "reward": args.reward or REWARDS.get(name, REWARD)})
    result = next((r for r in results if r["model"] == name), None)
    if result is None:
        write_drift_texts(args.out, args.out / name, name, args.drift_lines)
        result = {"model": name, "seconds": args.seconds, "reward": args.reward,
                  "start": score(str(model), args.out / "test.jsonl"),
                  "start_val": score(str(model), args.out / "val.jsonl"), "tuning": [], "final": []}
        results.append(result)
    tuning = result["tuning"]
    for i in range(len(SETTINGS["sgd"])):
        if any(r["setting_index"] == i for r in tuning):
            continue
        settings = {m: resolve(SETTINGS[m][i], tuning) for m in SETTINGS}
        for r in side_by_side(args, name, args.out / name / f"tune-{i}", settings, 0, "val"):
            tuning.append({"setting_index": i, **r})
        print(json.dumps([{k: r[k] for k in ("method", "setting", "score", "steps", "sigma", "lr_start")}
                          for r in tuning[-2:]]), file=sys.stderr, flush=True)
        save()
    result["best"] = {m: max((r for r in tuning if r["method"] == m), key=lambda r: r["score"])["setting"]
                      for m in SETTINGS}
    for seed in args.seeds:
        if any(r["seed"] == seed for r in result["final"]):
            continue
        result["final"] += side_by_side(args, name, args.out / name / f"final-{args.seconds:.0f}s",
                                         result["best"], seed, "test")
        save()
    return result


def cell(values, fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def table(result: dict) -> None:
    print(f"\n{result['model']} ({result['seconds']:g} s a run, reward {result.get('reward')}; accuracy before "
          f"fine-tuning: test {result['start']:.1%}, validation {result.get('start_val', float('nan')):.1%})\n")
    print("| # | update | setting | validation accuracy (seed 0) | steps | sigma | lr (first step) | "
          "drift NLL change |\n|---:|---|---|---:|---:|---:|---:|---:|")
    for r in result["tuning"]:
        print(f"| {r['setting_index']} | {r['method']} | `{' '.join(r['setting'])}` | {r['score']:.1%} | {r['steps']} "
              f"| {r['sigma']:.3g} | {r['lr_start']:.3g} | {r['final_drift_nll_change']:+.3f} |")
    print("\n| update | chosen setting | seeds | test accuracy (median, min-max) | steps | drift NLL change | "
          "NLL change: answer but last digit | last digit | prompt | weights' rms change |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for method in SETTINGS:
        runs = [r for r in result["final"] if r["method"] == method]
        if not runs:
            continue
        print(f"| {method} | `{' '.join(result['best'][method])}` | {len(runs)} | "
              f"{cell([100 * r['score'] for r in runs], '.1f')}% | {cell([r['steps'] for r in runs], '.0f')} | "
              + " | ".join(cell([r[k] for r in runs], f) for k, f in (
                  ("final_drift_nll_change", "+.3f"), ("final_nll_change/answer", "+.3f"),
                  ("final_nll_change/last_digit", "+.3f"), ("final_nll_change/prompt", "+.3f"),
                  ("final_weight_rms_change", ".4f"))) + " |")


def main() -> None:
    parser = race_parser(__doc__.splitlines()[0], "runs/update54", ["flawed", "last-digit"])
    parser.add_argument("--reward", help="the training reward of every model (default: REWARDS's, else the race's "
                                          "dense one; scoring is always the exact-answer accuracy)")
    parser.add_argument("--drift-lines", type=int, default=300)
    args = parser.parse_args()
    path = args.out / args.results
    if args.report:
        for result in json.loads(path.read_text()):
            table(result)
        return
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / args.results
    prepare(args, args.out)
    results = json.loads(path.read_text()) if path.is_file() else []
    results = [r for r in results if r["seconds"] == args.seconds]

    def save():
        path.write_text(json.dumps(results, indent=1))

    for name in args.models:
        table(race(args, name, results, save))
        save()


if __name__ == "__main__":
    main()
