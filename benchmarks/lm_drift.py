"""Drift and forgetting at equal reward gain (issue 46): nesgpu's ES with and without ``--anchor`` beside TRL's GRPO,
in the design of benchmarks/lm_vs_grpo.py's race (one model, one reward function, 120 s and one thread per run,
each ES run beside a GRPO run at the same time).

The off-task text is held-out pretraining text: lines of the model's own pretraining corpus
(``examples/lm_reward_demo.py``'s ``corpus``) whose prompt is in none of the race's splits (train, validation,
test), so the reward task never trains on them, written once to ``OUT/drift.txt``. The model was pretrained on the
answers only (what follows "="), and the flawed teacher's answers are wrong in their last digit, the one the reward
teaches; so on each run's final weights (a fresh copy) :func:`token_nll` also splits the text's NLL by token: the
prompt tokens (never learned), the answer's last digit (the flaw the task corrects) and the answer's other tokens
(what the model knew and the reward does not contradict: its forgetting).

Beside the 120 s pairs, short runs stopped after ``--es-stops``/``--grpo-stops`` seconds give both methods'
final weights at accuracies the other reaches, for the split by token at equal accuracy.

Every run evaluates the same way (nesgpu's task: ``eval_kl``, ``drift_nll``, ``drift_nll_change`` and the greedy
accuracy on the test split) every ``--eval-seconds``; :func:`at_level` reads each curve at fixed accuracy
levels. Each ES run of the pairs has a GRPO run of its own beside it (GRPO seeds 0, 1, ... in order). The race's
directory (``--race``) gives the model and the splits:

    python benchmarks/lm_drift.py --race runs/race43 --out runs/drift46 --trl-python .venv-trl/bin/python
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "examples"), str(HERE)]
from lm_reward_demo import corpus  # noqa: E402
from lm_vs_grpo import MODELS, es_run, grpo_run, score  # noqa: E402

MEASURES = ("accuracy", "drift_nll", "drift_nll_change", "eval_kl")
ES = ["--sigma", "0.01", "--lr", "3e-4", "--lr-schedule", "constant"]  # the race's tuned ES on `flawed`
GRPO = ["--lr", "3e-5", "--temperature", "1.0"]  # the race's tuned GRPO on `flawed` (beta 0, TRL's default)


def write_drift_texts(race: Path, out: Path, model: str, lines: int) -> None:
    """``OUT/drift.txt``: ``lines`` held-out lines of ``model``'s pretraining corpus (a seeded draw)."""
    flaw, _, *error = MODELS[model]
    prompts = {json.loads(r)["prompt"] for name in ("train", "val", "test")
               for r in (race / f"{name}.jsonl").read_text().splitlines()}
    val = [json.loads(r)["prompt"] for r in (race / "val.jsonl").read_text().splitlines()]
    held = [t.strip() for t in corpus(error[0] if error else 0.5, seed=0, flaw=flaw, exclude=val)
            if t.split("=")[0] + "=" not in prompts]
    (out / "drift.txt").write_text("".join(t + "\n" for t in random.Random(0).sample(held, lines)))


def es_curve(run: Path) -> list[dict]:
    """An ES run's evaluations (metrics.csv rows with an accuracy): seconds, step and the measures."""
    with open(run / "metrics.csv", newline="") as f:
        return [{"seconds": float(r["seconds"]), "iteration": int(r["step"]),
                 **{k: float(r[k]) if r.get(k) else None for k in MEASURES}}
                for r in csv.DictReader(f) if r["accuracy"]]


def pair(args, anchor: float, es_seed: int, grpo_seed: int) -> list[dict]:
    """An ES run (``--anchor anchor``) beside a GRPO run, both with the drift text; each with its curve."""
    work = args.out / f"anchor{anchor:g}-es{es_seed}-grpo{grpo_seed}"
    drift = ["--drift-text", str(args.out / "drift.txt")]
    runs = [("nesgpu_es", [*args.es, "--anchor", f"{anchor:g}", *drift], es_run, es_seed),
            ("grpo", [*GRPO, *drift], grpo_run, grpo_seed)]
    for method, *_ in runs:
        (work / method).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda r: r[2](args, work / r[0], args.model, r[1], r[3], "test"), runs))
    return [{"method": method, "anchor": anchor if method == "nesgpu_es" else None, "seed": seed,
             "budget": args.seconds, "setting": setting, "weights": run["weights"],
             "curve": es_curve(work / method / f"es-seed{seed}") if method == "nesgpu_es" else run["curve"]}
            for (method, setting, _, seed), run in zip(runs, done)]


def final_measures(args, weights: str) -> dict:
    """The saved weights against the starting model (fresh copies, float32): the root mean square of the weights'
    change, the change of drift_nll (nesgpu's function) on the drift text, and of :func:`token_nll`'s three parts."""
    import torch

    from nesgpu.tasks.divergence import drift_nll, read_texts

    texts = read_texts(args.out / "drift.txt")
    (end, tokenizer), (start, _) = (load(w) for w in (weights, str(args.model)))
    moved = torch.cat([(a - b).detach().flatten() for a, b in zip(end.parameters(), start.parameters())])
    values = {"final_weight_rms_change": float(moved.pow(2).mean().sqrt()),
              "final_drift_nll_change": drift_nll(end, tokenizer, texts) - drift_nll(start, tokenizer, texts)}
    after, before = token_nll(end, tokenizer, texts), token_nll(start, tokenizer, texts)
    values.update({f"final_nll_change/{k}": after[k] - before[k] for k in after})
    return values


def load(weights: str):
    """A fresh float32 copy of saved weights, in eval mode, and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(weights).eval(), AutoTokenizer.from_pretrained(weights)


def token_nll(model, tokenizer, texts: list[str]) -> dict[str, float]:
    """The mean NLL of the texts' predicted tokens in three parts: ``prompt`` (up to and with "="), ``answer``
    (the answer's tokens but its last) and ``last_digit``."""
    import torch

    sums = dict.fromkeys(("prompt", "answer", "last_digit"), 0.0)
    counts = dict.fromkeys(sums, 0)
    equals = tokenizer.convert_tokens_to_ids("=")
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text).input_ids])
            nll = torch.nn.functional.cross_entropy(model(input_ids=ids).logits[0, :-1], ids[0, 1:], reduction="none")
            at = ids[0].tolist().index(equals)
            for i, value in enumerate(nll.tolist(), 1):
                part = "prompt" if i <= at else "last_digit" if i == ids.shape[1] - 1 else "answer"
                sums[part], counts[part] = sums[part] + value, counts[part] + 1
    return {k: sums[k] / counts[k] for k in sums}


def stops(args, results: list[dict]) -> list[dict]:
    """Short runs (ES without the anchor, GRPO) stopped after each of their budgets, seeds 0-2, an ES lane beside
    a GRPO lane; the runs already in ``results`` are skipped."""
    done = {(r["method"], r["budget"], r["seed"]) for r in results}
    lanes = [[("nesgpu_es", s, seed) for s in args.es_stops for seed in (0, 1, 2)],
             [("grpo", s, seed) for s in args.grpo_stops for seed in (0, 1, 2)]]
    lanes = [[r for r in lane if r not in done] for lane in lanes]
    with ThreadPoolExecutor(2) as pool:
        found = pool.map(lambda lane: [short_run(args, *run) for run in lane], lanes)
        return [r for lane in found for r in lane]


def short_run(args, method: str, seconds: float, seed: int) -> dict:
    """One run of ``method`` (the race's setting, ES without the anchor) stopped after ``seconds``."""
    work = args.out / f"stop{seconds:g}s" / method
    work.mkdir(parents=True, exist_ok=True)
    drift = ["--drift-text", str(args.out / "drift.txt")]
    setting = [*args.es, "--anchor", "0", *drift] if method == "nesgpu_es" else [*GRPO, *drift]
    run = (es_run if method == "nesgpu_es" else grpo_run)(argparse.Namespace(**{**vars(args), "seconds": seconds}),
                                                        work, args.model, setting, seed, "test")
    curve = es_curve(work / f"es-seed{seed}") if method == "nesgpu_es" else run["curve"]
    return {"method": method, "anchor": 0.0 if method == "nesgpu_es" else None, "seed": seed, "budget": seconds,
            "setting": setting, "curve": curve, "weights": run["weights"]}


def at_level(curve: list[dict], level: float) -> dict | None:
    """The measures where the curve first reaches ``level`` accuracy, linear between the evaluations around it;
    None where it never does."""
    for before, after in itertools.pairwise(curve):
        if after["accuracy"] >= level > before["accuracy"]:
            t = (level - before["accuracy"]) / (after["accuracy"] - before["accuracy"])
            return {k: before[k] + t * (after[k] - before[k]) if before.get(k) is not None and after.get(k) is not None
                    else None for k in ("seconds", "drift_nll_change", "eval_kl")}  # eval_kl: none with kl off
    return None


def groups(results: list[dict], budgets: bool) -> dict[str, list[dict]]:
    """The runs by method (ES by its anchor), and with ``budgets`` by their budget too."""
    out = {}
    for r in sorted(results, key=lambda r: (r["method"], r["anchor"] or 0, r["budget"])):
        name = f"ES, anchor {r['anchor']:g}" if r["method"] == "nesgpu_es" else "GRPO"
        out.setdefault(f"{name}, {r['budget']:g} s" if budgets else name, []).append(r)
    return out


def cell(values: list[float], fmt: str) -> str:
    """Median (min-max) of the values, or the value alone."""
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def tables(results: list[dict], seconds: float) -> None:
    """The final weights of every group of runs, and the full runs' in-run measures at 25%, 50% and 60% accuracy
    and at the highest level every one of them reaches (a group's cell only where all its runs reach the level)."""
    print("| runs | seeds | test accuracy | drift_nll_change | eval_kl | NLL change: answer but last digit | "
          "last digit | prompt | weights' rms change | steps |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    columns = [("final_drift_nll_change", ".3f"), ("final_nll_change/answer", ".3f"),
               ("final_nll_change/last_digit", ".3f"), ("final_nll_change/prompt", ".3f"),
               ("final_weight_rms_change", ".4f")]
    for name, runs in groups(results, budgets=True).items():
        cells = [cell([100 * r["score"] for r in runs], ".1f") + "%"]
        cells += [cell([r[k] for r in runs], f) for k, f in columns[:1]]
        kl = [r["curve"][-1].get("eval_kl") for r in runs]  # none where kl was off (ES's default)
        cells += [cell([k for k in kl if k is not None], ".3f")]
        cells += [cell([r[k] for r in runs], f) for k, f in columns[1:]]
        cells += [cell([r["curve"][-1]["iteration"] for r in runs], ".0f")]
        print(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    full = [r for r in results if r["budget"] == seconds]
    by = groups(full, budgets=False)
    top = min(max(p["accuracy"] for p in r["curve"]) for r in full)
    levels = sorted({0.25, 0.5, 0.6, round(top - 0.005, 3)})
    print("\n| accuracy level | " + " | ".join(f"{n}: drift_nll_change; eval_kl; seconds" for n in by)
          + " |\n|---|" + "---:|" * len(by))
    for level in levels:
        cells = []
        for runs in by.values():
            at = [a for a in (at_level(r["curve"], level) for r in runs) if a]
            if len(at) < len(runs):
                cells.append(f"reached by {len(at)} of {len(runs)}")
                continue
            cells.append("; ".join(cell([a[k] for a in at if a[k] is not None], f) for k, f in
                                   (("drift_nll_change", ".3f"), ("eval_kl", ".3f"), ("seconds", ".0f"))) + " s")
        print(f"| {level:.1%} | " + " | ".join(cells) + " |")


def rescore(args, results: list[dict]) -> None:
    """Each run's test accuracy (a fresh copy of its saved weights, lm_vs_grpo.py's score) and final measures,
    where not yet taken."""
    for r in results:
        if "final_nll_change/answer" not in r:
            r.update(score=score(r["weights"], args.out / "test.jsonl"), **final_measures(args, r["weights"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--race", type=Path, default=Path("runs/race43"), help="lm_vs_grpo.py's OUT: model, splits")
    parser.add_argument("--model-name", default="flawed", choices=list(MODELS))
    parser.add_argument("--out", type=Path, default=Path("runs/drift46"))
    parser.add_argument("--anchors", type=float, nargs="+", default=[0.0, 1e-3, 1e-2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="ES seeds (each anchor)")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--eval-seconds", type=float, default=5)
    parser.add_argument("--es-stops", type=float, nargs="*", default=[20, 60], help="budgets of the short ES runs")
    parser.add_argument("--grpo-stops", type=float, nargs="*", default=[5, 10, 20], help="those of GRPO's")
    parser.add_argument("--drift-lines", type=int, default=300)
    parser.add_argument("--es", nargs="*", default=ES, help="ES's options over the task's (given empty: its "
                                                            "defaults; default: the race's tuned setting)")
    parser.add_argument("--trl-python", default="python", help="a python with trl installed")
    parser.add_argument("--reward", default="arith_reward:exact")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="only print the tables of OUT/results.json")
    args = parser.parse_args()
    path = args.out / "results.json"
    if args.report:
        tables(json.loads(path.read_text()), args.seconds)
        return
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.model = (args.race / args.model_name / "model").resolve()
    for name in ("train", "val", "test"):  # es_run and grpo_run read the splits from OUT
        (args.out / f"{name}.jsonl").write_text((args.race / f"{name}.jsonl").read_text())
    write_drift_texts(args.race, args.out, args.model_name, args.drift_lines)
    results = [{"budget": args.seconds, **r} for r in json.loads(path.read_text())] if path.is_file() else []
    full = [r for r in results if r["budget"] == args.seconds]
    done = {(r["anchor"], r["seed"]) for r in full if r["method"] == "nesgpu_es"}
    grpo_seed = max([r["seed"] + 1 for r in full if r["method"] == "grpo"], default=0)
    for seed in args.seeds:  # seed by seed, so that a cut-short run has every anchor at the first seeds
        for anchor in args.anchors:
            if (anchor, seed) not in done:
                results += pair(args, anchor, seed, grpo_seed)
                grpo_seed += 1
                path.write_text(json.dumps(results, indent=1))
    results += stops(args, results)
    rescore(args, results)
    path.write_text(json.dumps(results, indent=1))
    tables(results, args.seconds)


if __name__ == "__main__":
    main()
