"""A decode step of the population's ``generate()`` against plain ``generate()``, operation by operation.

For each model size (a Llama from a config, the demo's character tokenizer, the arithmetic prompts), both
generate the same rows (members x prompts) under ``torch.profiler``; the table lists, per generated token,
the operators each side dispatches (count and self time), the operators the population adds first. The
totals say how many operators, how many of them compute (not views, allocations or other metadata), and how
much host time a generated token costs on each side.

    python benchmarks/decode_profile.py [--sizes 64x2 512x4] [--population 64] [--top 15]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import nesgpu
from nesgpu.tasks.verifiers import arithmetic_problems

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hf_population import add_device_options, device_of  # noqa: E402  (this folder's)
from lm_reward_demo import llama_config, train_tokenizer  # noqa: E402


METADATA = frozenset(f"aten::{op}" for op in (
    "view", "reshape", "_reshape_alias", "transpose", "t", "as_strided", "unsqueeze", "squeeze", "expand", "select",
    "slice", "alias", "detach", "resolve_conj", "resolve_neg", "empty", "new_empty", "empty_strided", "permute",
    "contiguous", "lift_fresh", "_unsafe_view", "flatten", "unflatten", "split", "chunk", "narrow", "to", "_to_copy",
    "empty_like", "zeros", "ones", "full", "result_type", "is_nonzero", "item", "_local_scalar_dense"))


def op_table(fn, steps: int) -> tuple[Counter, Counter]:
    """(count, self microseconds) per aten operator of one call of fn, divided by ``steps``."""
    fn()  # warm: caches, lazy imports
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    counts, times = Counter(), Counter()
    for e in prof.key_averages():
        if e.key.startswith("aten::"):
            counts[e.key] += e.count / steps
            times[e.key] += e.self_cpu_time_total / steps
    return counts, times


def profile_size(size: str, args, tokenizer, device) -> None:
    hidden, layers = (int(v) for v in size.split("x"))
    from transformers import LlamaForCausalLM

    def model():
        torch.manual_seed(0)
        m = LlamaForCausalLM(llama_config(tokenizer, hidden, layers)).to(device).eval()
        m.generation_config.eos_token_id = None
        return m

    plain, net = model(), nesgpu.convert(model(), "lowrank", evolve=args.evolve)
    pm = nesgpu.PerturbedModel(net, args.population // 2, sigma=1e-3, antithetic=True)
    pm.set_noise(step=0)
    prompts = [p for p, _ in arithmetic_problems(args.prompts, seed=0)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    rows, mask = pm.member_rows(enc.input_ids.to(device)), pm.member_rows(enc.attention_mask.to(device))
    options = dict(max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)

    def population():
        with pm.perturbing():
            net.generate(input_ids=rows, attention_mask=mask, **options)

    with torch.no_grad():
        p_count, p_time = op_table(lambda: plain.generate(input_ids=rows, attention_mask=mask, **options),
                                   args.new_tokens)
        q_count, q_time = op_table(population, args.new_tokens)
    print(f"\n### hidden {hidden}, {layers} layers: {rows.shape[0]} rows, per generated token\n")
    print("| operator | plain: calls | population: calls | plain: self us | population: self us |")
    print("|---|---:|---:|---:|---:|")
    keys = sorted(set(p_count) | set(q_count), key=lambda k: -(q_time[k] - p_time[k]))
    for k in keys[: args.top]:
        print(f"| {k} | {p_count[k]:.1f} | {q_count[k]:.1f} | {p_time[k]:.0f} | {q_time[k]:.0f} |")
    print(f"| **all operators** | {sum(p_count.values()):.0f} | {sum(q_count.values()):.0f} | "
          f"{sum(p_time.values()):.0f} | {sum(q_time.values()):.0f} |")
    computing = [sum(v for k, v in c.items() if k not in METADATA) for c in (p_count, q_count)]
    print(f"| **computing operators** | {computing[0]:.0f} | {computing[1]:.0f} | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["64x2", "512x4"], help="HIDDENxLAYERS of each Llama")
    parser.add_argument("--population", type=int, default=64, help="members (directions x 2 signs)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--evolve", default="all", choices=["all", "matrices"])
    parser.add_argument("--top", type=int, default=15, help="operators listed, by the time the population adds")
    add_device_options(parser)
    args = parser.parse_args()
    device, _ = device_of(args)
    tokenizer = train_tokenizer([f"{p}{a}\n" for p, a in arithmetic_problems(4000, seed=0)])
    for size in args.sizes:
        profile_size(size, args, tokenizer, device)


if __name__ == "__main__":
    main()
