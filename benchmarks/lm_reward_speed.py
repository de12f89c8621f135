"""The ES step of a language model on a reward: its generation against plain ``generate()`` of the same rows,
and members per second against the one-member-at-a-time way of "Evolution Strategies at Scale".

For each model size (a Llama from a config, the demo's character tokenizer, the arithmetic prompts), timed
in one run, interleaved round by round (median of repeats):

- ``plain``: the plain model's batched ``generate()`` of the step's rows (members x prompts), greedy;
- ``population``: the same rows through the perturbed population's ``generate()`` (low-rank noise);
- ``fitness``: the whole ES evaluation, ``GenerationTask.fitness`` (tokenize, generate, decode, reward);
- ``one_at_a_time``: ES at Scale's loop for the same members: perturb every weight in place with Gaussian
  noise from the member's seed, generate for the prompts, decode, reward, restore.

With ``--compiled``, the same three again through the compiled static-cache decode
(:class:`nesgpu.decode.CompiledDecode`, a graph for each model, compiled before timing): ``plain_compiled``,
``population_compiled`` and ``fitness_compiled`` (``GenerationTask(compile=...)``). Every row's prompt is
left-padded to the longest prompt of the task, as a compiled task pads it, so all sides see the same shapes.

Every row generates exactly ``--new-tokens`` tokens (no early stop), so tokens per second are rows x tokens.

    python benchmarks/lm_reward_speed.py [--sizes 64x2 256x4] [--population 64] [--compiled] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import nesgpu
from nesgpu.decode import CompiledDecode
from nesgpu.tasks.generation import GenerationTask
from nesgpu.tasks.verifiers import arithmetic_problems, arithmetic_reward, rewards_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hf_population import add_device_options, device_of, timed  # noqa: E402  (this folder's)
from lm_reward_demo import llama_config, train_tokenizer  # noqa: E402


def one_at_a_time(model, task: GenerationTask, prompts: list[str], members: int, sigma: float, seed: int) -> list:
    """ES at Scale's evaluation: member after member, theta += sigma * z (z from the member's seed), generate
    for the prompts, score, theta -= sigma * z."""
    from transformers import GenerationConfig

    params = [p for p in model.parameters() if p.requires_grad]
    enc = task.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    ids, mask = enc.input_ids.to(params[0].device), enc.attention_mask.to(params[0].device)
    config = GenerationConfig(max_new_tokens=task.max_new_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=task.tokenizer.pad_token_id)
    rewards = []
    for member in range(members):
        gen = torch.Generator(device=ids.device).manual_seed(seed * 100_003 + member)
        noise = [torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype) for p in params]
        for p, z in zip(params, noise):
            p.add_(z, alpha=sigma)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        texts = [t.split("\n", 1)[0] for t in task.tokenizer.batch_decode(out[:, ids.shape[1]:],
                                                                           skip_special_tokens=True)]
        rewards.append(task.reward(prompts, texts))
        for p, z in zip(params, noise):
            p.sub_(z, alpha=sigma)
    return rewards


def measure(size: str, args, tokenizer, device, sync) -> dict:
    hidden, layers = (int(v) for v in size.split("x"))
    prompts = [p for p, _ in arithmetic_problems(4000, seed=0)]
    options = dict(max_new_tokens=args.new_tokens, prompts_per_step=args.prompts)
    task = GenerationTask(prompts, tokenizer, rewards_of(arithmetic_reward), **options)

    def model():
        torch.manual_seed(0)
        from transformers import LlamaForCausalLM
        m = LlamaForCausalLM(llama_config(tokenizer, hidden, layers)).to(device, args.dtype).eval()
        m.generation_config.eos_token_id = None  # every row generates --new-tokens tokens
        return m

    plain, net = model(), nesgpu.convert(model(), "lowrank", evolve=args.evolve)
    pm = nesgpu.PerturbedModel(net, args.population // 2, sigma=1e-3, antithetic=True)
    pm.set_noise(step=0)
    step_prompts = task.step_prompts(0)
    longest = max(len(ids) for ids in tokenizer(prompts).input_ids)
    enc = tokenizer(step_prompts, return_tensors="pt", padding="max_length", max_length=longest, padding_side="left")
    rows, mask = pm.member_rows(enc.input_ids.to(device)), pm.member_rows(enc.attention_mask.to(device))
    gen = dict(input_ids=rows, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False,
               pad_token_id=tokenizer.pad_token_id)

    def population(**compiled):
        with pm.perturbing():
            net.generate(**gen, **compiled)

    fns = {"plain": lambda: plain.generate(**gen), "population": population, "fitness": lambda: task.fitness(pm, 0),
           "one_at_a_time": lambda: one_at_a_time(plain, task, step_prompts, args.population, 1e-3, 0)}
    if args.compiled:
        plain_decode, decode = CompiledDecode(device), CompiledDecode(device)  # one graph per model
        compiled_task = GenerationTask(prompts, tokenizer, rewards_of(arithmetic_reward), **options, compile=decode)
        fns.update(plain_compiled=lambda: plain.generate(**gen, **plain_decode.options),
                   population_compiled=lambda: population(**decode.options),
                   fitness_compiled=lambda: compiled_task.fitness(pm, 0))
    with torch.no_grad():
        med = timed(fns, args.repeats, sync)
    tokens = rows.shape[0] * args.new_tokens
    ratios = {"population_vs_plain": med["plain"] / med["population"], "fitness_vs_plain": med["plain"] / med["fitness"]}
    if args.compiled:
        ratios.update(compiled_population_vs_plain=med["plain_compiled"] / med["population_compiled"],
                      compiled_fitness_vs_plain=med["plain_compiled"] / med["fitness_compiled"],
                      compiled_population_vs_eager_plain=med["plain"] / med["population_compiled"],
                      graphs=plain_decode.graphs + decode.graphs)
    fitness = med["fitness_compiled" if args.compiled else "fitness"]
    return {"size": size, "params": sum(p.numel() for p in plain.parameters()), "rows": rows.shape[0],
            "tokens_per_s": {k: tokens / v for k, v in med.items() if k != "one_at_a_time"}, **ratios,
            "members_per_s": {"batched": args.population / fitness,
                              "one_at_a_time": args.population / med["one_at_a_time"]},
            "batched_vs_one_at_a_time": med["one_at_a_time"] / fitness, "seconds": med}


def print_table(results: list[dict], compiled: bool) -> None:
    """One row per size: eager ratios, then compiled ones (to compiled plain), then members per second (of the
    compiled fitness with --compiled)."""
    extra = " compiled: population / plain | fitness / plain | population / eager plain |" if compiled else ""
    print(f"| model | params | rows | population gen / plain gen | fitness / plain gen |{extra} members/s batched | "
          f"one at a time | ratio |")
    print("|---|---:|---:|---:|---:|" + "---:|" * (3 if compiled else 0) + "---:|---:|---:|")
    for r in results:
        m = r["members_per_s"]
        cells = [r["size"], f"{r['params']:,}", r["rows"], f"{r['population_vs_plain']:.2f}", f"{r['fitness_vs_plain']:.2f}"]
        if compiled:
            cells += [f"{r['compiled_population_vs_plain']:.2f}", f"{r['compiled_fitness_vs_plain']:.2f}",
                      f"{r['compiled_population_vs_eager_plain']:.2f}"]
        cells += [f"{m['batched']:.0f}", f"{m['one_at_a_time']:.1f}", f"{r['batched_vs_one_at_a_time']:.1f}x"]
        print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["64x2", "256x4"], help="HIDDENxLAYERS of each Llama")
    parser.add_argument("--population", type=int, default=64, help="members (directions x 2 signs)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (every member answers all)")
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--evolve", default="all", choices=["all", "matrices"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compiled", action="store_true", help="also time the compiled static-cache decode")
    add_device_options(parser)
    args = parser.parse_args()
    device, sync = device_of(args)
    tokenizer = train_tokenizer([f"{p}{a}\n" for p, a in arithmetic_problems(4000, seed=0)])
    results = [measure(size, args, tokenizer, device, sync) for size in args.sizes]
    print_table(results, args.compiled)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "args": {k: str(v) for k, v in vars(args).items()}},
                                              indent=1))


if __name__ == "__main__":
    main()
