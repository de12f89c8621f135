"""A population's batched ``generate()`` at the size of a real small LM: a Qwen2.5-0.5B- or 1.5B-shaped Qwen2
(random weights from the config: the shapes, vocabulary, grouped-query attention and tied embeddings of the
release), every member answering every prompt, against plain ``generate()`` of the same rows and against ES at
Scale's one member at a time (each member's Gaussian noise added to every weight in place, its prompts
generated, the weights restored), the way its authors run a population through an inference engine.

Every row generates exactly ``--new-tokens`` tokens (no early stop), so tokens per second are rows x tokens.
Timed in one run, interleaved round by round, medians of ``--repeats``; the one-at-a-time loop runs
``--serial-members`` members and is scaled to the population. ``--compiled`` also times plain and population
``generate()`` through the compiled static-cache decode (:class:`nesgpu.decode.CompiledDecode`, compiled before
timing; CUDA graphs on a GPU).

    python benchmarks/lm_population_scale.py --device cuda --bf16 --shape 0.5b --members 128 --prompts 8
    python benchmarks/lm_population_scale.py --shape tiny --members 8 --prompts 2   # a CPU smoke test
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from hf_population import add_device_options, device_of, timed  # this folder's

import nesgpu
from nesgpu.decode import CompiledDecode

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, vocab (Qwen2.5's released configs)
    "0.5b": (896, 4864, 24, 14, 2, 151_936),
    "1.5b": (1536, 8960, 28, 12, 2, 151_936),
    "tiny": (64, 128, 2, 4, 2, 1000),
}


def qwen2(shape: str, dtype, device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, intermediate, layers, heads, kv, vocab = SHAPES[shape]
    config = Qwen2Config(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                         tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device, dtype).eval()
    model.generation_config.eos_token_id = None  # every row generates --new-tokens tokens
    return model


def one_at_a_time(model, ids, mask, members: int, sigma: float, options: dict) -> None:
    """ES at Scale's evaluation of ``members``: theta += sigma * z (z from the member's seed), generate the
    member's prompts, theta -= sigma * z."""
    params = [p for p in model.parameters() if p.requires_grad]
    for member in range(members):
        gen = torch.Generator(device=ids.device).manual_seed(member)
        for p in params:  # one tensor of noise at a time: the whole model's noise would double its memory
            p.add_(torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype), alpha=sigma)
        model.generate(input_ids=ids, attention_mask=mask, **options)
        gen = torch.Generator(device=ids.device).manual_seed(member)
        for p in params:
            p.sub_(torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype), alpha=sigma)


def measure(args, device, sync) -> dict:
    plain = qwen2(args.shape, args.dtype, device)
    net = nesgpu.convert(qwen2(args.shape, args.dtype, device), "lowrank", evolve=args.evolve)
    pm = nesgpu.PerturbedModel(net, args.members // 2, sigma=1e-3, antithetic=True)
    pm.set_noise(step=0)
    vocab = SHAPES[args.shape][5]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (args.prompts, args.prompt_tokens), generator=gen).to(device)
    mask = torch.ones_like(ids)
    rows, row_mask = pm.member_rows(ids), pm.member_rows(mask)
    options = dict(max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    def population(**compiled):
        with pm.perturbing():
            net.generate(input_ids=rows, attention_mask=row_mask, **options, **compiled)

    fns = {"plain": lambda: plain.generate(input_ids=rows, attention_mask=row_mask, **options),
           "population": population,
           "one_at_a_time": lambda: one_at_a_time(plain, ids, mask, args.serial_members, 1e-3, options)}
    if args.compiled:
        plain_decode, decode = CompiledDecode(device), CompiledDecode(device)
        fns.update(plain_compiled=lambda: plain.generate(input_ids=rows, attention_mask=row_mask, **options,
                                                         **plain_decode.options),
                   population_compiled=lambda: population(**decode.options))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with torch.no_grad():
        med = timed(fns, args.repeats, sync)
    tokens = rows.shape[0] * args.new_tokens
    serial = med["one_at_a_time"] * args.members / args.serial_members  # the whole population, one at a time
    return {"shape": args.shape, "params": sum(p.numel() for p in plain.parameters()), "rows": rows.shape[0],
            "tokens_per_s": {"plain": tokens / med["plain"], "population": tokens / med["population"],
                             "one_at_a_time": tokens / serial},
            "population_vs_plain": med["plain"] / med["population"],
            "compiled_population_vs_plain": (med["plain_compiled"] / med["population_compiled"]) if args.compiled
            else None,
            "members_per_s": {"batched": args.members / med["population"], "one_at_a_time": args.members / serial},
            "batched_vs_one_at_a_time": serial / med["population"], "seconds": med,
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.5b", choices=list(SHAPES))
    parser.add_argument("--members", type=int, default=128, help="population (directions x 2 signs)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts every member answers")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--serial-members", type=int, default=4, help="members the one-at-a-time loop times")
    parser.add_argument("--evolve", default="matrices", choices=["all", "matrices"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compiled", action="store_true", help="also time the compiled static-cache decode")
    add_device_options(parser)
    args = parser.parse_args()
    device, sync = device_of(args)
    r = measure(args, device, sync)
    t = r["tokens_per_s"]
    print("| shape | params | rows | plain tokens/s | population tokens/s | population / plain | members/s batched "
          "| one at a time | ratio | peak GiB |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
    print(f"| {r['shape']} | {r['params'] / 1e6:.0f} M | {r['rows']} | {t['plain']:,.0f} | {t['population']:,.0f} | "
          f"{r['population_vs_plain']:.2f} | {r['members_per_s']['batched']:.1f} | "
          f"{r['members_per_s']['one_at_a_time']:.2f} | {r['batched_vs_one_at_a_time']:.1f}x | {peak} |")
    if args.compiled:
        print(f"compiled decode: population / plain {r['compiled_population_vs_plain']:.2f}; population tokens/s "
              f"{r['rows'] * args.new_tokens / r['seconds']['population_compiled']:,.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"result": r, "args": {k: str(v) for k, v in vars(args).items()}},
                                              indent=1))


if __name__ == "__main__":
    main()
