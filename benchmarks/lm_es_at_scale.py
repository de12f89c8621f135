"""The baseline of "Evolution Strategies at Scale" (Qiu et al., 2025), written from the paper's description:
one member at a time, each perturbing every weight in place with Gaussian noise regenerated from its seed,
greedy decoding, rewards z-scored across the population, and theta += alpha * mean_n(r_n * eps_n).
Population 30, sigma 0.001, alpha 5e-4 by default, as in the paper.

Trains a local Hugging Face model on a built-in reward task for a wall-clock budget and writes the held-out
accuracy curve (seconds, generated tokens, accuracy) as JSON:

    python benchmarks/lm_es_at_scale.py --model DIR --task arithmetic --seconds 600 --seed 0 --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch

from nesgpu.noise import derive_seed
from nesgpu.tasks import make_task


def member_noise(params, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device=params[0].device).manual_seed(seed)
    return [torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype) for p in params]


def member_rewards(model, task, prompts, params, seeds, sigma) -> torch.Tensor:
    """Each member's mean reward over ``prompts``: perturb in place, generate greedily, score, restore."""
    enc = task.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    ids, mask = enc.input_ids.to(params[0].device), enc.attention_mask.to(params[0].device)
    rewards = []
    for seed in seeds:
        noise = member_noise(params, seed)
        for p, z in zip(params, noise):
            p.add_(z, alpha=sigma)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=task.max_new_tokens,
                             do_sample=False, pad_token_id=task.tokenizer.pad_token_id)
        texts = task.tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        rewards.append(task.reward(prompts, [t.split("\n", 1)[0] for t in texts]).mean())
        for p, z in zip(params, noise):
            p.sub_(z, alpha=sigma)
    return torch.stack(rewards)


def train(args) -> dict:
    torch.manual_seed(args.seed)
    task = make_task(args.task, seed=args.seed, batch_size=args.prompts, model=f"hf:{args.model}")
    model = task.make_model((), f"hf:{args.model}")
    params = [p for p in model.parameters() if p.requires_grad]
    curve, tokens, start, iteration = [], 0, time.perf_counter(), 0
    last_eval = -float("inf")
    with torch.no_grad():
        while True:
            elapsed = time.perf_counter() - start
            if elapsed - last_eval >= args.eval_seconds or elapsed >= args.seconds:
                curve.append({"seconds": elapsed, "tokens": tokens, "iteration": iteration,
                              "accuracy": task.evaluate(model)})
                print(json.dumps(curve[-1]), flush=True)
                last_eval = elapsed
                if elapsed >= args.seconds:
                    break
            prompts = task.step_prompts(iteration)
            seeds = [derive_seed(args.seed, iteration, n) for n in range(args.population)]
            rewards = member_rewards(model, task, prompts, params, seeds, args.sigma)
            tokens += args.population * len(prompts) * task.max_new_tokens
            shaped = (rewards - rewards.mean()) / rewards.std().clamp_min(1e-8) if rewards.std() > 0 else None
            if shaped is not None:
                for seed, r in zip(seeds, shaped.tolist()):
                    for p, z in zip(params, member_noise(params, seed)):
                        p.add_(z, alpha=args.alpha * r / args.population)
            iteration += 1
    return {"method": "es_at_scale", "seed": args.seed, "curve": curve,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "options": {k: v for k, v in vars(args).items() if k != "json"}}


def budget_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every method of benchmarks/lm_vs_grpo.py takes: model, task, budget, evaluations."""
    parser.add_argument("--model", required=True, help="a local Hugging Face model directory")
    parser.add_argument("--task", default="arithmetic", choices=["arithmetic", "countdown"])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--eval-seconds", type=float, default=60)
    return parser


def main() -> None:
    parser = budget_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--population", type=int, default=30)
    parser.add_argument("--sigma", type=float, default=1e-3)
    parser.add_argument("--alpha", type=float, default=5e-4)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    Path(args.json).write_text(json.dumps(train(args), indent=1))


if __name__ == "__main__":
    main()
