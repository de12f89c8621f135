"""Issue 54's memory table on a GPU: ``torch.cuda.max_memory_allocated`` of plain inference and of two ES steps of
``nesgpu train --task generation`` (``--update sgd``, the default, and ``--update strategy``: Adam over float32
masters), each in a fresh process, on a Qwen2-shaped model with random bfloat16 weights (benchmarks/lm_memory.py
makes it and its prompts). Run by benchmarks/gpu_check.sh:

    python benchmarks/lm_memory_gpu.py --size 0.5B --out runs/mem_gpu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import lm_memory  # noqa: E402

WORKER = """
import json, sys, torch
kind, model, data, out, update = sys.argv[1:6]
data = json.loads(data)
if kind == "inference":
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).cuda().eval()
    rows = [json.loads(line)["prompt"] for line in open(data["prompts"])][:16]
    batch = tok(rows, return_tensors="pt", padding=True).to("cuda")
    for _ in range(2):
        lm.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
else:
    from nesgpu.train import TrainConfig, train
    train(TrainConfig(task="generation", model="hf:" + model, dtype="bfloat16", population=8, batch_size=2,
                      max_new_tokens=8, steps=2, sigma=0.001, update=update, prompts=data["prompts"],
                      eval_prompts=data["eval_prompts"], reward=data["reward"] + ":correct", log="none",
                      progress_every=0, device="cuda", out=out, overwrite=True))
print(json.dumps({"peak_gb": torch.cuda.max_memory_allocated() / 1e9}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="0.5B", choices=list(lm_memory.SIZES))
    parser.add_argument("--out", type=Path, default=Path("runs/mem_gpu"))
    args = parser.parse_args()
    model = args.out / f"qwen2-{args.size}"
    if not (model / "config.json").is_file():
        lm_memory.worker_create(argparse.Namespace(size=args.size, model=str(model)))
    data = lm_memory.write_data(args.out)
    rows = []
    for kind, update in (("inference", "-"), ("nesgpu", "sgd"), ("nesgpu", "strategy")):
        result = subprocess.run([sys.executable, "-c", WORKER, kind, str(model), json.dumps(data),
                                 str(args.out / f"run-{update}"), update], capture_output=True, text=True)
        if result.returncode:
            rows.append((kind, update, None, result.stderr.strip().splitlines()[-1:]))
            continue
        rows.append((kind, update, json.loads(result.stdout.strip().splitlines()[-1])["peak_gb"], None))
    base = rows[0][2]
    print(f"| {args.size} | update | max_memory_allocated GB | vs inference |\n|---|---|---:|---:|")
    for kind, update, peak, error in rows:
        ratio = f"{peak / base:.2f}x" if peak and base else "-"
        print(f"| {kind} | {update} | {peak:.2f} | {ratio} |" if peak else f"| {kind} | {update} | failed: {error} | |")


if __name__ == "__main__":
    main()
