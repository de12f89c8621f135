"""Tokens per second of a language model's population: on vLLM (every member a LoRA adapter, one generate for every
(prompt, member) row), through transformers' generate (nesgpu's HF path), and plain vLLM on the same rows without
adapters (the ceiling). One mode per process (an engine per process), the engine's start untimed, one warm-up
call, then the median of --repeats.

    python benchmarks/vllm_population.py --model DIR --mode vllm --population 32   # in the vLLM venv
    python benchmarks/vllm_population.py --make-model DIR                          # a random Llama of that size

Modes: plain (vLLM, no adapters), vllm (the population on vLLM), hf (the population through generate()).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

PROMPTS = ["12+7=", "3*4=", "99-1=", "5+5=", "8*8=", "17-9=", "6+13=", "2*21="]


# Qwen2's shapes at 0.5B and 1.5B (a Llama of those sizes, random weights: the speed depends on the shapes)
SIZES = {"tiny": dict(hidden_size=512, intermediate_size=1365, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=None),
         "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, vocab_size=151936),
         "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                      num_key_value_heads=2, vocab_size=151936)}


def make_model(where: str, size: str) -> None:
    import torch
    import transformers as tf

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import CHARS, char_tokenizer

    torch.manual_seed(0)
    shape = {**SIZES[size], "vocab_size": SIZES[size]["vocab_size"] or len(CHARS) + 3}
    config = tf.LlamaConfig(**shape, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=1,
                            tie_word_embeddings=True, initializer_range=0.2)
    tf.LlamaForCausalLM(config).save_pretrained(where)
    char_tokenizer().save_pretrained(where)


def population(model_dir: str, size: int, dtype: str, device: str):
    import torch
    import transformers as tf

    import nesgpu

    model = tf.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype)).eval().to(device)
    pm = nesgpu.PerturbedModel(nesgpu.convert(model, "lowrank", evolve="matrices", rank=4), size // 2, sigma=0.05,
                               antithetic=True, seed=0)
    pm.set_noise(step=0)
    return pm


def timed(call, repeats: int) -> tuple[float, int]:
    """Median seconds of ``call()`` (after one warm-up) and the tokens it generates."""
    tokens = call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), tokens


def run(args) -> dict:
    import torch
    from transformers import AutoTokenizer

    from nesgpu.engines import adapter_config, check_members, member_adapters

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pm = population(args.model, args.population, args.dtype, device)
    ids = [tokenizer(p).input_ids for p in PROMPTS]
    d = pm.local_directions
    rows = [ids[n // d % len(ids)] for n in range(2 * len(ids) * d)]
    members = [n // (len(ids) * d) * d + n % d for n in range(len(rows))]
    if args.mode == "hf":
        enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left").to(device)

        def call():
            with pm.perturbing():
                out = pm.model.generate(input_ids=pm.member_rows(enc.input_ids), attention_mask=pm.member_rows(
                    enc.attention_mask), do_sample=False, max_new_tokens=args.new_tokens, pad_token_id=0,
                    temperature=None, top_p=None, top_k=None)
            new = out[:, enc.input_ids.shape[1]:]
            return int((new != 0).sum())
    else:
        from nesgpu.engines.vllm_engine import VLLMEngine

        names = check_members(pm)
        engine = VLLMEngine(args.model, members=len(set(members)), rank=4, max_model_len=64, dtype=args.dtype,
                            kv_cache_gib=args.kv_cache_gib)
        if args.mode == "plain":
            from vllm import SamplingParams

            params = SamplingParams(max_tokens=args.new_tokens, temperature=0)

            def call():  # the same engine's model without adapters: no LoRA request
                out = engine.llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
                return sum(len(o.outputs[0].token_ids) for o in out)
        else:
            def call():  # each step registers its members anew
                engine.set_members(member_adapters(pm, names), adapter_config(names, 4))
                return sum(map(len, engine.generate(rows, members, args.new_tokens)))
    seconds, tokens = timed(call, args.repeats)
    return {"mode": args.mode, "population": args.population, "rows": len(rows), "tokens": tokens,
            "seconds": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1), "threads": torch.get_num_threads(),
            "device": device, "dtype": args.dtype}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--make-model", metavar="DIR")
    p.add_argument("--size", choices=tuple(SIZES), default="tiny", help="with --make-model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--mode", choices=("plain", "vllm", "hf"), default="vllm")
    p.add_argument("--population", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.make_model:
        make_model(args.make_model, args.size)
        return
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
