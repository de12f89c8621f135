"""A population of a Hugging Face Llama-style model against plain inference of the same rows.

Times, in one run and interleaved (median of repeats):
- the population forward (pm(ids)) against the plain forward of the same rows, every parameter evolving
  and with evolve="matrices";
- the population generate() against the plain generate() of the same rows (KV cache, greedy);
- the ES-at-Scale way: perturb every weight in place, evaluate one member, restore, member after member
  (members per second against the batched population, same rows and tokens).
Then a memory table: model bytes, noise bytes per member and KV cache per row for the low-rank kind at
rank 1-4, and on paper the population that fits in 80 GB for a 1B and a 7B Llama.

    python benchmarks/hf_population.py [--hidden 256 512] [--device cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch
import transformers as tf

import nesgpu


def llama(hidden: int, layers: int, vocab: int, dtype, device):
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                            num_hidden_layers=layers, num_attention_heads=hidden // 64,
                            num_key_value_heads=hidden // 128,
                            max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def timed(fns: dict, repeats: int, sync) -> dict[str, float]:
    """Median seconds of each callable, the callables interleaved round by round (a noisy machine)."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def in_place_member(model, params, sigma, seed, row_ids, new_tokens):
    """One member the ES-at-Scale way: theta += sigma z (z regenerated from a seed), evaluate, restore."""
    gen = torch.Generator(device=row_ids.device).manual_seed(seed)
    with torch.no_grad():
        noise = [torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype) for p in params]
        for p, z in zip(params, noise):
            p.add_(z, alpha=sigma)
        if new_tokens:
            model.generate(input_ids=row_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=0)
        else:
            model(input_ids=row_ids)
        for p, z in zip(params, noise):
            p.sub_(z, alpha=sigma)


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """--device, --bf16 and --json, shared by the language-model benchmarks."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="hold the models in bfloat16 (for a GPU)")
    parser.add_argument("--json")


def device_of(args) -> tuple[torch.device, object]:
    """The parsed options' device, with ``args.dtype`` set from --bf16, and its synchronisation (a no-op off
    CUDA) for timing."""
    args.dtype = torch.bfloat16 if args.bf16 else torch.float32
    device = torch.device(args.device)
    return device, (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def speed(hidden: int, args, device, sync) -> dict:
    directions, rows = args.directions, 2 * args.directions
    ids = torch.randint(3, args.vocab, (rows, args.tokens), device=device)
    prompt = ids[:, : args.tokens // 2]
    result = {"hidden": hidden}
    plain = llama(hidden, args.layers, args.vocab, args.dtype, device)
    with torch.no_grad():
        for evolve in ("all", "matrices"):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a fallback warning would mean an unbatched module
                net = nesgpu.convert(llama(hidden, args.layers, args.vocab, args.dtype, device), "lowrank",
                                     evolve=evolve)
            pm = nesgpu.PerturbedModel(net, directions, sigma=1e-3, antithetic=True)
            pm.set_noise()

            def generate_population():
                with pm.perturbing():
                    net.generate(input_ids=prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 do_sample=False, pad_token_id=0)

            t = timed({"plain_forward": lambda: plain(input_ids=ids),
                       "population_forward": lambda: pm(input_ids=ids),
                       "plain_generate": lambda: plain.generate(input_ids=prompt, max_new_tokens=args.new_tokens,
                                                                min_new_tokens=args.new_tokens, do_sample=False,
                                                                pad_token_id=0),
                       "population_generate": generate_population}, args.repeats, sync)
            result[evolve] = {"forward_ratio": t["population_forward"] / t["plain_forward"],
                              "generate_ratio": t["population_generate"] / t["plain_generate"], "seconds": t}
        params = list(plain.parameters())
        members = min(args.in_place_members, rows)
        one_by_one = timed({"in_place": lambda: [in_place_member(plain, params, 1e-3, m, ids[m : m + 1], 0)
                                                 for m in range(members)]}, max(1, args.repeats // 3), sync)
        batched = result["all"]["seconds"]["population_forward"]
        result["members_per_s"] = {"batched": rows / batched, "in_place": members / one_by_one["in_place"]}
        result["members_per_s"]["ratio"] = result["members_per_s"]["batched"] / result["members_per_s"]["in_place"]
    return result


def memory(hidden: int, args, device) -> dict:
    net = nesgpu.convert(llama(hidden, args.layers, args.vocab, torch.float32, device), "lowrank")
    table = {"model_bytes": sum(p.numel() * p.element_size() for p in net.parameters())}
    for rank in (1, 2, 3, 4):
        net = nesgpu.convert(llama(hidden, args.layers, args.vocab, torch.float32, device), "lowrank", rank=rank)
        pm = nesgpu.PerturbedModel(net, args.directions, antithetic=True)
        pm.set_noise()
        table[f"noise_bytes_per_member_rank{rank}"] = pm.noise_bytes() / args.directions
    cfg = net.config
    table["kv_bytes_per_row_per_token_fp32"] = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * 4
    return table


def on_paper(name, hidden, layers, inter, vocab, kv_heads, head_dim, rank=1, tokens=1024, budget=80e9) -> dict:
    """Population that fits in ``budget`` bytes for a bf16 Llama: model (bf16) + fp32 masters (+ Adam's 8 B/param,
    or none for plain SGD as ES at Scale), then per member: low-rank noise (fp32 draw + bf16 copy) and the KV
    cache (bf16) of one row of ``tokens``."""
    matrices = layers * (2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter) + vocab * hidden
    params = matrices + vocab * hidden + (2 * layers + 1) * hidden  # + embedding table + norms
    fixed = {"adam": params * (2 + 4 + 8), "sgd": params * (2 + 4)}
    noise = rank * 6 * (layers * (4 * hidden + 2 * kv_heads * head_dim + 2 * (hidden + inter) + (inter + hidden))
                        + (vocab + hidden))  # rank * (in + out) per matrix, 4 + 2 bytes
    kv = 2 * layers * kv_heads * head_dim * tokens * 2
    return {"model": name, "params": params, "tokens": tokens, "fixed_bytes": fixed,
            "noise_bytes_per_member": noise, "kv_bytes_per_row": kv,
            "population_fits": {k: max(0, int((budget - v) // (noise + kv))) for k, v in fixed.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--directions", type=int, default=64, help="rows = 2 x directions (antithetic)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per row of the forward")
    parser.add_argument("--new-tokens", type=int, default=16, help="generated tokens after a prompt of tokens/2")
    parser.add_argument("--in-place-members", type=int, default=32, help="members timed one at a time")
    parser.add_argument("--repeats", type=int, default=9)
    add_device_options(parser)
    args = parser.parse_args()
    device, sync = device_of(args)
    torch.set_grad_enabled(False)
    results = {"speed": [speed(h, args, device, sync) for h in args.hidden],
               "memory": [dict(hidden=h, **memory(h, args, device)) for h in args.hidden],
               "on_paper": [on_paper("Llama-3.2-1B", 2048, 16, 8192, 128256, 8, 64),
                            on_paper("Llama-2-7B", 4096, 32, 11008, 32000, 32, 128)],
               "args": {k: str(v) for k, v in vars(args).items()}}
    print("| hidden | evolve | population forward / plain | population generate / plain |")
    print("|---:|---|---:|---:|")
    for r in results["speed"]:
        for evolve in ("all", "matrices"):
            ratios = r[evolve]
            print(f"| {r['hidden']} | {evolve} | {ratios['forward_ratio']:.3f} | {ratios['generate_ratio']:.3f} |")
    for r in results["speed"]:
        m = r["members_per_s"]
        print(f"hidden {r['hidden']}: members/s batched {m['batched']:.0f}, one at a time in place {m['in_place']:.1f} "
              f"({m['ratio']:.0f}x)")
    for r in results["memory"]:
        print(json.dumps(r))
    for r in results["on_paper"]:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
