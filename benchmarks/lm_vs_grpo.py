"""A tuned race: nesgpu's ES against TRL's GRPO on the same work, each run beside the other at the same time.

For each of two pretrained small Llamas (the demo's, whose teacher is wrong in the answer's last digit half the
time, and one whose teacher is wrong in the first digit), on the arithmetic prompts and one reward function
(``benchmarks/arith_reward.py``, called unchanged by both: ``nesgpu train --task generation --reward ...`` and
``GRPOTrainer``):

1. tuning: every method tries the same number of settings of its own main options (ES: sigma, lr, population,
   prompts per step; GRPO: lr and temperature), seed 0, one budget each, ES setting i beside GRPO setting i;
   each is scored on the validation split;
2. the best setting of each method runs for every seed, scored on the held-out test split.

Every score is one function (:func:`score`): greedy accuracy of a fresh copy of the run's final weights, loaded
from the directory the run saved. The curves (accuracy on the run's split against seconds, steps and generated
tokens) come from each run's own evaluations of its plain model, with the same nesgpu evaluation.

GRPO runs in its own environment with ``trl`` (``--trl-python``). Writes ``results.json`` and prints the tables:

    python benchmarks/lm_vs_grpo.py --out runs/race --seconds 120 --trl-python TRLENV/bin/python
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
sys.path[:0] = [str(HERE.parent / "examples"), str(HERE)]
from lm_reward_demo import corpus, pretrain, train_tokenizer  # noqa: E402

REWARD = "arith_reward:correct"
# each pretrained model: its teacher's flaw, and whether its corpus leaves out the validation prompts ("demo" is
# examples/lm_reward_demo.py's model as the demo makes it: its corpus holds the validation prompts, not the test's)
MODELS = {"last-digit": ("last", True), "first-digit": ("first", True), "demo": ("last", False),
          # its teacher always one too high in the last digit: near 0% before fine-tuning (issue 43's binary race)
          "flawed": ("last", True, 1.0),
          # its teacher always wrong in the first digit: a second binary race near 0% (issue 56)
          "flawed-first": ("first", True, 1.0)}
SETTINGS = {  # the same number per method, over its own main options; the first is each one's default
    "nesgpu_es": [[], ["--sigma", "0.01", "--lr", "3e-4"], ["--population", "64", "--batch-size", "4"],
                  ["--sigma", "0.001", "--lr", "3e-5"]],
    "grpo": [["--lr", "3e-5", "--temperature", "0.7"], ["--lr", "1e-4", "--temperature", "0.7"],
             ["--lr", "3e-5", "--temperature", "1.0"], ["--lr", "1e-5", "--temperature", "0.7"]],
}


def write_splits(out: Path) -> None:
    """train.jsonl (the arithmetic task's 4000 training problems), test.jsonl (its 200 held-out ones) and
    val.jsonl (200 more, from another seed, in neither), each row a prompt and its answer."""
    from nesgpu.tasks.reward_tasks import splits
    from nesgpu.tasks.verifiers import arithmetic_problems

    answers = dict(arithmetic_problems(4000, seed=0) + arithmetic_problems(800, seed=1))
    train, test = splits(arithmetic_problems)
    taken = set(train) | set(test)
    val = [(p, a) for p, a in dict(arithmetic_problems(1000, seed=2)).items() if p not in taken][:200]
    for name, rows in (("train", [(p, answers[p]) for p in train]), ("test", [(p, answers[p]) for p in test]),
                       ("val", val)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows))


def prepare(args, out: Path) -> None:
    """The splits, and each pretrained model (its corpus holds no validation or test prompt)."""
    if not (out / "val.jsonl").is_file():
        write_splits(out)
    excluded = [json.loads(line)["prompt"] for line in (out / "val.jsonl").read_text().splitlines()]
    for name in args.models:
        flaw, without_validation, *error = MODELS[name]
        directory = out / name / "model"
        if (directory / "config.json").is_file():
            continue
        lines = corpus(error[0] if error else 0.5, seed=0, flaw=flaw, exclude=excluded if without_validation else ())
        tokenizer = train_tokenizer(lines)
        pretrain(tokenizer, lines, args.pretrain_steps, seed=0).save_pretrained(directory)
        tokenizer.save_pretrained(directory)


def env(args) -> dict:
    threads = str(args.threads)
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
            "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}


def es_run(args, work: Path, model: Path, setting: list[str], seed: int, split: str) -> dict:
    """``nesgpu train --task generation`` for the budget; its curve from metrics.csv, its model in RUN/hf."""
    run = work / f"es-seed{seed}"
    command = [sys.executable, "-m", "nesgpu", "train", "--task", "generation", "--model", f"hf:{model}",
               "--prompts", str(args.out / "train.jsonl"), "--eval-prompts", str(args.out / f"{split}.jsonl"),
               "--reward", args.reward, "--correct-at", "1", "--max-new-tokens", "6", "--time-budget",
               str(args.seconds), "--steps", "1000000", "--eval-seconds", str(args.eval_seconds), "--seed", str(seed), "--out", str(run),
               "--overwrite", "--log", "none", *setting]
    result = subprocess.run(command, capture_output=True, text=True, env=env(args))
    if result.returncode:
        raise RuntimeError(f"ES {setting} seed {seed} failed: {result.stderr[-2000:]}")
    return es_result(run)


def es_result(run: Path) -> dict:
    """A finished ES run's curve (from metrics.csv) and where its model is (RUN/hf)."""
    curve, tokens = [], 0
    with open(run / "metrics.csv", newline="") as f:
        for r in csv.DictReader(f):  # the tokens generated so far (rows x decoded length): TRL's num_tokens
            old = "num_tokens" not in r  # a run before TRL's names: each step's generated_tokens
            tokens = tokens + int(float(r["generated_tokens"] or 0)) if old else int(float(r["num_tokens"] or 0))
            if r["accuracy"]:
                curve.append({"seconds": float(r["seconds"]), "iteration": int(r["step"]),
                              "accuracy": float(r["accuracy"]), "tokens": tokens})
    return {"curve": curve, "weights": str(run / "hf")}


def grpo_run(args, work: Path, model: Path, setting: list[str], seed: int, split: str) -> dict:
    """benchmarks/lm_grpo.py for the budget; its curve, its model saved with save_pretrained."""
    path, saved = work / f"grpo-seed{seed}.json", work / f"grpo-seed{seed}"
    command = [args.trl_python, str(HERE / "lm_grpo.py"), "--model", str(model), "--train",
               str(args.out / "train.jsonl"), "--eval", str(args.out / f"{split}.jsonl"), "--reward", args.reward,
               "--seconds", str(args.seconds), "--eval-seconds", str(args.eval_seconds), "--seed", str(seed),
               "--json", str(path), "--save", str(saved), *setting]
    result = subprocess.run(command, capture_output=True, text=True, env=env(args))
    if result.returncode:
        raise RuntimeError(f"GRPO {setting} seed {seed} failed: {result.stderr[-2000:]}")
    return {"curve": json.loads(path.read_text())["curve"], "weights": str(saved)}


def score(weights: str, split_file: Path) -> float:
    """The one score of every run: greedy accuracy on ``split_file`` of a fresh copy of the weights."""
    from nesgpu.tasks import make_task

    task = make_task("generation", model=f"hf:{weights}", prompts=str(split_file), eval_prompts=str(split_file),
                     reward=REWARD, correct_at=1.0, max_new_tokens=6)
    return task.evaluate(task.make_model((), f"hf:{weights}"))


def side_by_side(args, work: Path, model: Path, es_setting, grpo_setting, seed: int, split: str) -> list[dict]:
    """An ES run and a GRPO run at the same time (one thread each), each scored on ``split``."""
    runs = [("nesgpu_es", es_setting, es_run), ("grpo", grpo_setting, grpo_run)]
    for method, _, _ in runs:
        (work / method).mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda r: r[2](args, work / r[0], model, r[1], seed, split), runs))
    return [{"method": method, "setting": setting, "seed": seed, "split": split, **run,
             "score": score(run["weights"], args.out / f"{split}.jsonl")}
            for (method, setting, _), run in zip(runs, done)]


def race(args, name: str) -> dict:
    """Tuning on the validation split (seed 0), then each method's best setting on the test split, per seed;
    with ``--tuned FILE``, the tuning and choice of an earlier race of the same model instead."""
    model = args.out / name / "model"
    if args.tuned:
        earlier = next(r for r in json.loads(args.tuned.read_text()) if r["model"] == name)
        tuning, best = earlier["tuning"], earlier["best"]
    else:
        tuning = []
        for i, (es_setting, grpo_setting) in enumerate(zip(SETTINGS["nesgpu_es"], SETTINGS["grpo"])):
            tuning += side_by_side(args, args.out / name / f"tune-{i}", model, es_setting, grpo_setting, 0, "val")
            print(json.dumps(tuning[-2:])[:400], file=sys.stderr, flush=True)
        best = {m: max((r for r in tuning if r["method"] == m), key=lambda r: r["score"])["setting"]
                for m in SETTINGS}
    final, work = [], args.out / name / f"final-{args.seconds:.0f}s"
    es_final = [] if args.es_defaults else best["nesgpu_es"]
    for seed in args.seeds:
        final += side_by_side(args, work, model, es_final, best["grpo"], seed, "test")
    return {"model": name, "start": score(str(model), args.out / "test.jsonl"), "tuning": tuning, "best": best,
            "final": final}


def table(result: dict) -> None:
    """One model's tables: the tuning (validation accuracy of each setting) and the race on the test split."""
    print(f"\n{result['model']} (test accuracy before fine-tuning {result['start']:.1%})\n")
    print("| method | setting | validation accuracy (seed 0) |\n|---|---|---:|")
    for r in result["tuning"]:
        print(f"| {r['method']} | `{' '.join(r['setting']) or 'defaults'}` | {r['score']:.1%} |")
    print("\n| method | chosen setting | test accuracy (median, min-max) | in-run evaluation at the end | steps | "
          "generated tokens |\n|---|---|---:|---:|---:|---:|")
    for method in SETTINGS:
        runs = [r for r in result["final"] if r["method"] == method]
        end = [r["score"] for r in runs]
        print(f"| {method} | `{' '.join(runs[0]['setting']) or 'defaults'}` | {statistics.median(end):.1%} "
              f"({min(end):.1%}-{max(end):.1%}) | {statistics.median(r['curve'][-1]['accuracy'] for r in runs):.1%} | "
              f"{statistics.median(r['curve'][-1]['iteration'] for r in runs):.0f} | "
              f"{statistics.median(r['curve'][-1]['tokens'] for r in runs):,.0f} |")
    curves(result)


def curves(result: dict) -> None:
    """The final runs' in-run test accuracy against seconds (each evaluation time, median over seeds), with the
    steps and generated tokens by then."""
    runs = {m: [r["curve"] for r in result["final"] if r["method"] == m] for m in SETTINGS}
    points = min(len(c) for curves in runs.values() for c in curves)
    print("\n| seconds | " + " | ".join(f"{m}: accuracy, steps, tokens" for m in runs) + " |\n|---:|"
          + "---:|" * len(runs))
    for i in range(points):
        seconds = statistics.median(c[i]["seconds"] for curves in runs.values() for c in curves)
        cells = [f"{statistics.median(c[i]['accuracy'] for c in curves):.1%}, "
                 f"{statistics.median(c[i]['iteration'] for c in curves):.0f}, "
                 f"{statistics.median(c[i]['tokens'] for c in curves):,.0f}" for curves in runs.values()]
        print(f"| {seconds:.0f} | " + " | ".join(cells) + " |")


def race_parser(description: str, out: str, models: list[str]) -> argparse.ArgumentParser:
    """The options every race over MODELS takes (this one's and lm_update.py's): where, how long, which seeds and
    models, the pretraining, threads and the results file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--seconds", type=float, default=120, help="each run's wall-clock budget")
    parser.add_argument("--eval-seconds", type=float, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=models, choices=list(MODELS))
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1, help="threads of each run (two run at a time)")
    parser.add_argument("--results", default="results.json", help="the file in OUT the results go to")
    parser.add_argument("--report", action="store_true", help="only print the tables of OUT/RESULTS")
    return parser


def main() -> None:
    parser = race_parser(__doc__.splitlines()[0], "runs/race", ["last-digit", "first-digit"])
    parser.add_argument("--trl-python", default="python", help="a python with trl installed")
    parser.add_argument("--reward", default=REWARD, help="the training reward of both methods (scoring is always the "
                                                         "exact-answer accuracy); arith_reward:exact is binary")
    parser.add_argument("--tuned", type=Path, help="an earlier results.json: its tuning and choices, not a new one")
    parser.add_argument("--es-defaults", action="store_true",
                        help="the final runs race ES at its defaults (not its best tuning setting) against tuned GRPO")
    args = parser.parse_args()
    if args.report:
        for result in json.loads((args.out / args.results).read_text()):
            table(result)
        return
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    prepare(args, args.out)
    results = []
    for name in args.models:
        results.append(race(args, name))
        (args.out / args.results).write_text(json.dumps(results, indent=1))
        table(results[-1])


if __name__ == "__main__":
    main()
