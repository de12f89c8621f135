"""Every causal-LM type transformers maps, built small with random weights, put through ``nesgpu.check``.

For each type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (benchmarks/hf_zoo.py builds it from its own config
class, its sizes shrunk), in its own process with a time limit: the population's forward is compared with
every member's own model, module by module, in float64, and so is KV-cache ``generate()``, greedy and sampled
(each sampled row's logits against its member's own along the same tokens). Each type
ends as one of

    exact          forward and generate (greedy, sampled) equal every member's own model
    refused        convert or the first population call refuses it with a one-line reason (never silent)
    DIFFERENT      a silent difference: the worst outcome, the target is none
    generate fails the forward is exact, generate() raises
    not built      the type cannot be built small (a vision tower's input, an optional package, ...)

with the share of its trainable parameters that the exact (slow) torch.func fallback takes.

    python benchmarks/hf_sweep.py --json benchmarks/results/hf_sweep.json --markdown docs/hf_zoo.md
    python benchmarks/hf_sweep.py --types llama gpt2 mamba        # a few types
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

POPULAR = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "olmo", "olmo2",
           "gpt2", "opt", "falcon", "deepseek_v3", "gpt_oss", "mamba", "mamba2"]


def one(model_type: str) -> dict:
    """The check of one type, as a JSON-ready dict."""
    import warnings

    import torch

    import nesgpu
    from hf_zoo import build_small, example_inputs

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    model, why = build_small(model_type)
    if model is None:
        return {"type": model_type, "outcome": "not built", "why": why}
    params = sum(p.numel() for p in model.parameters())
    report = nesgpu.check(model, example_inputs(model, 2), directions=2, max_new_tokens=3)
    if report.refused and report.refused.startswith("the model itself fails"):  # e.g. not written for float64
        report = nesgpu.check(model, example_inputs(model, 2), directions=2, max_new_tokens=3, dtype=torch.float32)
    if report.refused is not None:
        outcome, why = "refused", report.refused.splitlines()[0]
    elif report.exact:
        outcome = "exact"
        why = (f"{len(report.unused)} modules a text-only call never reaches (a vision tower, cross-attention): "
               f"freeze them to train" if report.unused else "")
    elif report.first_difference is None and report.generate and report.generate.startswith("fails"):
        outcome, why = "generate fails", report.generate
    elif report.first_difference is None and not _per_sample(model, example_inputs(model, 2)) and nesgpu.check(
            model, example_inputs(model, 1), directions=2, max_new_tokens=3).exact:
        outcome = "exact"  # the family's own batched generate is not per sample: one sample per member is exact
        why = "exact with one sample; the family's own batched generate() mixes its samples (transformers' code)"
    else:
        first = report.first_difference
        outcome = "DIFFERENT"
        why = (f"{first.name} ({first.type}) {first.error:.1e}" if first else f"generate {report.generate}")
    train_too = os.environ.get("NESGPU_SWEEP_TRAIN") == "1"  # set by the parent's --train
    trained = trains(model, model_type, list(report.unused)) if train_too and outcome == "exact" else None
    return {"type": model_type, "outcome": outcome, "why": why[:300], "parameters": params, "trains": trained,
            "unused": list(report.unused),
            "worst": report.worst, "fallback_share": report.fallback_share, "fallback": sorted(report.fallback),
            "seconds": round(time.perf_counter() - start, 2)}


def trains(model, model_type: str, unused: list[str]) -> str:
    """"yes" when one ES step through the trainer (the arithmetic task, from a local directory), a
    checkpoint, a resume to a second step and the saved RUN/hf reloaded by transformers all work; else why.
    The ``unused`` modules (a text-only call never reaches them) are frozen first, as a user would."""
    import copy
    import dataclasses
    import tempfile
    from pathlib import Path

    import tokenizers
    import torch
    import transformers
    from safetensors.torch import load_file

    from hf_zoo import VOCAB
    from nesgpu.tasks.reward_tasks import load_causal_lm
    from nesgpu.train import TrainConfig, train

    chars = list("0123456789+-*/()=>: \n")
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    vocab.update({f"[X{i}]": i for i in range(len(vocab), VOCAB)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[PAD]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]")
    with tempfile.TemporaryDirectory() as tmp:
        directory, run = Path(tmp) / model_type, Path(tmp) / "run"
        try:
            model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)
            cfg = TrainConfig.flat(task="arithmetic", model=f"hf:{directory}", steps=1, population=4, batch_size=2,
                              eval_every=1, checkpoint_every=1, log="none", out=str(run))
            for name in unused:
                for p in model.get_submodule(name).parameters():
                    p.requires_grad_(False)
            train(cfg, model=copy.deepcopy(model) if unused else None, log=lambda *a, **k: None)
            train(dataclasses.replace(cfg, steps=2), model=copy.deepcopy(model) if unused else None, resume=True,
                  log=lambda *a, **k: None)
            back = load_causal_lm(run / "hf")  # AutoModelForCausalLM, or the class config.json names
            saved = load_file(run / "model.safetensors")
            own = back.state_dict()
            if not all(torch.equal(own[k].to(v.dtype), v) for k, v in saved.items() if k in own):
                return "RUN/hf does not hold the trained weights"
        except Exception as e:  # noqa: BLE001 - any family's failure is a row of the table
            return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    return "yes"


def _per_sample(model, inputs: dict) -> bool:
    """Whether the plain model's greedy generate() of a batch equals that of each sample alone."""
    import torch

    options = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        batch = model.generate(**inputs, **options)
        alone = [model.generate(**{k: v[i:i + 1] for k, v in inputs.items()}, **options)
                 for i in range(len(inputs["input_ids"]))]
    return all(a.shape == b.shape[1:] and torch.equal(a, b[0]) for a, b in zip(batch, alone))


def sweep(types: list[str], timeout: float, chunk: int = 16) -> list[dict]:
    """The types in worker processes of ``chunk`` types each (imports are paid once per process); the types of
    a worker that crashed or hung run again one per process, so that one crash or hang costs that type only."""
    results = {}
    for start in range(0, len(types), chunk):
        part = types[start:start + chunk]
        results.update(_run(part, timeout * len(part)))
        for t in part:
            if t not in results:
                results.update(_run([t], timeout) or {t: {"type": t, "outcome": "crashed or hung", "why": "?"}})
        for t in part:
            r = results[t]
            print(f"{t:<32} {r['outcome']:<15} {r.get('why', '')[:100]}", flush=True)
    return [results[t] for t in types]


def _run(types: list[str], timeout: float) -> dict[str, dict]:
    """{type: result} of the types one worker process finished."""
    try:
        done = subprocess.run([sys.executable, __file__, "--one", *types], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
        out = done.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {r["type"]: r for r in found}


def markdown(results: list[dict]) -> str:
    built = [r for r in results if r["outcome"] != "not built"]
    count = {o: sum(r["outcome"] == o for r in results) for o in
             ("exact", "refused", "DIFFERENT", "generate fails", "crashed", "timed out", "not built")}
    lines = [f"{len(results)} types; {len(built)} build small; of those: " + ", ".join(
        f"{o} {n} ({100 * n / max(len(built), 1):.0f}%)" for o, n in count.items() if n and o != "not built"),
        f"; not built {count['not built']}.", "",
        "| type | outcome | fallback share | trains | why |", "|---|---|---:|---|---|"]
    for r in results:
        share = f"{100 * r['fallback_share']:.1f}%" if "fallback_share" in r else ""
        why = r.get("why", "").replace("|", "\\|")
        trained = {None: "", "yes": "yes"}.get(r.get("trains"), f"no: {r.get('trains', '')}".replace("|", "\\|"))
        lines.append(f"| {r['type']}{' (popular)' if r['type'] in POPULAR else ''} | {r['outcome']} | {share} | "
                     f"{trained} | {why} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--one", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--types", nargs="*", help="model types (default: every causal-LM type)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per type")
    parser.add_argument("--train", action="store_true", help="also train every exact type one ES step through the "
                        "trainer, checkpoint, resume and reload RUN/hf")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.one:
        for t in args.one:
            print(json.dumps(one(t)), flush=True)
        return
    from hf_zoo import causal_lm_types

    if args.train:
        os.environ["NESGPU_SWEEP_TRAIN"] = "1"  # for the worker processes
    results = sweep(args.types or causal_lm_types(), args.timeout)
    table = markdown(results)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.markdown:  # the table replaces what follows the file's header (up to its line "<N> types; ...")
        old = args.markdown.read_text() if args.markdown.exists() else ""
        start = re.search(r"^\d+ types; ", old, flags=re.M)
        args.markdown.write_text((old[:start.start()] if start else "") + table)


if __name__ == "__main__":
    main()
