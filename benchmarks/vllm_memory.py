"""Peak resident memory (``/usr/bin/time -v``) of fresh processes on one model: plain vLLM inference (the engine
loaded from the directory, greedy completions of the prompts), an ES run that generates on vLLM (``nesgpu train
--engine vllm``), and the same run on transformers (``--engine hf``). The median of --repeats, the modes taking
turns; the ratio is to plain inference.

    python benchmarks/vllm_memory.py --model DIR --steps 2 --repeats 3     # in the vLLM venv
    python benchmarks/vllm_memory.py --model DIR --src OLD/src             # another checkout's nesgpu, for the runs
    python benchmarks/vllm_memory.py --model DIR --dtype bfloat16 --update sgd   # bf16, no float32 masters

Make a model with ``benchmarks/vllm_population.py --make-model DIR --size 0.5b``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

INFERENCE = """
import sys
if __name__ == "__main__":
    from transformers import AutoTokenizer
    from nesgpu.engines.vllm_engine import VLLMEngine
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    engine = VLLMEngine(sys.argv[1], members=0, rank=1, max_model_len=64, dtype=sys.argv[2])
    rows = [tokenizer(p).input_ids for p in ["12+7=", "3*4=", "99-1=", "5+5="]] * 8
    print(sum(map(len, engine.generate(rows, None, 8))))
"""


def command(mode: str, args, out: Path) -> list[str]:
    if mode == "plain":
        return [sys.executable, "-c", INFERENCE, args.model, args.dtype]
    return [sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--model", f"hf:{args.model}",
            "--engine", mode, "--evolve", "matrices", "--population", str(args.population), "--batch-size", "4",
            "--steps", str(args.steps), "--sigma", "0.01", "--lr", "0.001", "--log", "none", "--out", str(out),
            "--dtype", args.dtype, *(["--update", args.update] if args.update else [])]


def peak_gib(mode: str, args, out: Path) -> float:
    """The peak resident memory of one fresh process (GiB); a failed run is an error with its last lines."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.src, env.get("PYTHONPATH")]))
    done = subprocess.run(["/usr/bin/time", "-v", *command(mode, args, out)], capture_output=True, text=True,
                          env=env, cwd=out.parent)
    shutil.rmtree(out, ignore_errors=True)  # a run's checkpoint and export: twice the model on disk
    own = done.stderr.split("\tCommand being timed")[0]
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n" + "\n".join(own.splitlines()[-15:]))
    kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return kib / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--modes", default="plain,vllm,hf")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--src", help="a checkout's src directory whose nesgpu the processes import")
    p.add_argument("--dtype", default="float32", help="the weights' dtype, in inference and in the runs")
    p.add_argument("--update", help="the runs' --update (sgd, adam: in place, no float32 masters)")
    args = p.parse_args()
    modes = args.modes.split(",")
    peaks: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as where:
        for repeat in range(args.repeats):
            for mode in modes:
                peaks[mode].append(peak_gib(mode, args, Path(where) / f"{mode}{repeat}"))
    median = {mode: statistics.median(values) for mode, values in peaks.items()}
    base = median.get("plain")
    print(json.dumps({"peaks_gib": {m: [round(v, 3) for v in vs] for m, vs in peaks.items()},
                      "median_gib": {m: round(v, 3) for m, v in median.items()},
                      "ratio_to_plain": {m: round(v / base, 3) for m, v in median.items()} if base else None}))


if __name__ == "__main__":
    main()
