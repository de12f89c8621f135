"""What a batched form buys over the exact fallback: GPT-OSS (expert banks stored (in, out) with biases, a
router with a bias, attention sinks) as a population, its forward with every module batched against the same
modules run member by member in the exact fallback, and against plain inference of the same rows.

Interleaved rounds, median of repeats; one process, the threads torch picks (``--threads`` to set them).

    python benchmarks/hf_forms_speed.py [--hidden 128] [--directions 16] [--tokens 32] [--repeats 7]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings

import torch
import transformers as tf

import nesgpu


def gpt_oss(hidden: int, layers: int, vocab: int):
    config = tf.GptOssConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=hidden // 4, num_local_experts=8, num_experts_per_tok=2,
                             layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                             max_position_embeddings=256, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    return tf.GptOssForCausalLM(config).eval()


def fallback_names(model) -> list[str]:
    """The modules a batched form now covers and the fallback took before: experts, routers, attention."""
    return [n for n, m in model.named_modules() if type(m).__name__ in ("GptOssExperts", "GptOssTopKRouter",
                                                                         "GptOssAttention")]


def population(model, directions: int, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = nesgpu.PerturbedModel(nesgpu.convert(copy.deepcopy(model), "lowrank", **options), directions,
                                   sigma=0.01, antithetic=True)
    pm.set_noise()
    return pm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--directions", type=int, default=16, help="rows = 2 x directions (antithetic)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = gpt_oss(args.hidden, args.layers, args.vocab)
    model.set_experts_implementation("eager")  # the same experts code on every side
    batched = population(model, args.directions)
    fallback = population(model, args.directions, fallback=fallback_names(model))
    ids = torch.randint(3, args.vocab, (2 * args.directions, args.tokens), generator=torch.Generator().manual_seed(0))
    calls = {"plain": lambda: model(input_ids=ids), "batched": lambda: batched(input_ids=ids),
             "fallback": lambda: fallback(input_ids=ids)}
    times = {k: [] for k in calls}
    with torch.no_grad():
        for fn in calls.values():
            fn()  # warm-up (and the fallback's first call)
        for _ in range(args.repeats):
            for name, fn in calls.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {"hidden": args.hidden, "layers": args.layers, "rows": 2 * args.directions, "tokens": args.tokens,
              "threads": torch.get_num_threads(), "seconds": median,
              "batched_over_plain": median["batched"] / median["plain"],
              "fallback_over_batched": median["fallback"] / median["batched"]}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
