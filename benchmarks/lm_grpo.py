"""TRL's GRPO on the same work as nesgpu's ES: the same local model and tokenizer, the same train prompts
(drawn the same way), the same reward and the same held-out greedy evaluation (nesgpu's task), for a
wall-clock budget. Writes the held-out accuracy curve (seconds, generated tokens, accuracy) as JSON.

A benchmark-only peer: it runs in its own environment with ``trl`` installed (``pip install torch==2.13.0 trl``)
and nesgpu's source on the path:

    PYTHONPATH=src TRLENV/bin/python benchmarks/lm_grpo.py --model DIR --seconds 600 --seed 0 --json out.json

or, on prompt files and a reward function of TRL's signature (what ``nesgpu train --task generation`` takes):

    PYTHONPATH=src:benchmarks TRLENV/bin/python benchmarks/lm_grpo.py --model DIR --train train.jsonl \\
        --eval val.jsonl --reward arith_reward:correct --seconds 120 --json out.json --save DIR2

With ``--drift-text FILE`` every evaluation also records what ``nesgpu train --task generation --drift-text FILE``
logs, by the same functions of the same task: ``eval_kl`` (on the held-out greedy completions, from the starting
model), ``drift_nll`` and ``drift_nll_change`` (benchmarks/lm_drift.py).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from datasets import Dataset
from lm_es_at_scale import budget_arguments  # this folder's: the options every method takes
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from nesgpu.tasks import make_task
from nesgpu.tasks.reward_data import load_function, read_jsonl
from nesgpu.train.steps.anchor import StartingWeights

MEASURES = ("eval_kl", "drift_nll", "drift_nll_change")  # nesgpu's evaluation columns a --drift-text run records


class Budget(TrainerCallback):
    """Evaluates the plain model (nesgpu's task: greedy, held-out) every ``eval_seconds`` and stops the run
    once ``seconds`` of wall time have passed; the tokens count the completions generated."""

    def __init__(self, task, seconds: float, eval_seconds: float, tokens_per_step: int):
        self.task, self.seconds, self.eval_seconds, self.tokens_per_step = task, seconds, eval_seconds, tokens_per_step
        self.curve, self.start, self.last_eval = [], None, -float("inf")

    def record(self, model, step: int) -> None:
        elapsed = time.perf_counter() - self.start
        was_training = model.training
        model.eval()
        self.curve.append({"seconds": elapsed, "tokens": step * self.tokens_per_step, "iteration": step,
                           "accuracy": self.task.evaluate(model)})
        info = self.task.evaluation_info()
        self.curve[-1].update({k: info[k] for k in MEASURES if k in info})
        model.train(was_training)
        print(json.dumps(self.curve[-1]), flush=True)
        self.last_eval = elapsed

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.start = time.perf_counter()
        self.record(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        elapsed = time.perf_counter() - self.start
        if elapsed >= self.seconds:
            self.record(model, state.global_step)
            control.should_training_stop = True
        elif elapsed - self.last_eval >= self.eval_seconds:
            self.record(model, state.global_step)


def race_task(args):
    """The task of the run: ``--train``/``--eval`` files with ``--reward`` (what nesgpu's ``--task generation``
    builds from the same flags), or the built-in ``--task``."""
    if args.train is None:
        return make_task(args.task, seed=args.seed, batch_size=args.prompts, model=f"hf:{args.model}")
    return make_task("generation", seed=args.seed, batch_size=args.prompts, model=f"hf:{args.model}",
                     prompts=args.train, eval_prompts=args.eval, reward=args.reward, correct_at=1.0,
                     max_new_tokens=args.max_new_tokens, drift_text=args.drift_text)


def dataset_and_reward(args, task, steps: int):
    """The prompts in the order the ES run draws them (step s: ``task.step_prompts(s)``), each row with its
    file's other columns, and the reward function: the ``--reward`` function unchanged, or the built-in
    task's reward on the completions' first lines."""
    if args.train is None:
        def reward(prompts, completions, **kwargs):
            return task.reward(prompts, [c.split("\n", 1)[0] for c in completions]).tolist()
        return Dataset.from_dict({"prompt": [p for s in range(steps) for p in task.step_prompts(s)]}), reward
    rows = {row["prompt"]: row for row in read_jsonl(args.train)}
    return Dataset.from_list([rows[p] for s in range(steps) for p in task.step_prompts(s)]), load_function(args.reward)


def main() -> None:
    parser = budget_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt (GRPO's group)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", help="a JSON-lines file of training rows (a 'prompt' and other columns)")
    parser.add_argument("--eval", help="the held-out rows, as --train")
    parser.add_argument("--reward", help="with --train: the reward function, module:function (TRL's signature)")
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--save", help="save the trained model and tokenizer there (save_pretrained)")
    parser.add_argument("--drift-text", help="with --train: text the run never trains on; each evaluation also "
                                             "records eval_kl, drift_nll and drift_nll_change (nesgpu's)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    task = race_task(args)
    model = task.make_model((), f"hf:{args.model}")
    if args.drift_text:  # the starting weights, as nesgpu's trainer keeps them for its kl and drift columns
        task.compare_to(StartingWeights(model, list(model.parameters())))
    steps = 100_000
    dataset, reward = dataset_and_reward(args, task, steps // 100)
    budget = Budget(task, args.seconds, args.eval_seconds, args.prompts * args.generations * task.max_new_tokens)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, use_cpu=True, seed=args.seed, learning_rate=args.lr,
                            per_device_train_batch_size=args.prompts * args.generations,
                            num_generations=args.generations, max_completion_length=task.max_new_tokens,
                            temperature=args.temperature, beta=0.0, max_steps=steps, shuffle_dataset=False,
                            logging_steps=10**9, save_strategy="no", report_to=[], disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                              processing_class=task.tokenizer, callbacks=[budget])
        trainer.train()
    if args.save:
        model.eval().save_pretrained(args.save)
        task.tokenizer.save_pretrained(args.save)
    result = {"method": "grpo", "seed": args.seed, "curve": budget.curve,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "options": {k: v for k, v in vars(args).items() if k != "json"}}
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
