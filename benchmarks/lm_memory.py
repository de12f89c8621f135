"""Peak memory of fine-tuning a language model by TRL's GRPO, GRPO + LoRA and nesgpu's ES, against inference.

Issue 54: Qwen2-shaped causal LMs of 0.5B, 1.5B, 3B and 7B parameters (random weights, saved in bfloat16), each
method run for two steps in a fresh process under ``/usr/bin/time -v``, its peak RSS ("Maximum resident set
size") recorded:

- ``inference``: ``generate()`` of 16 rows, 8 new tokens, twice (the model loaded in bfloat16);
- ``grpo``: TRL's GRPOTrainer, full fine-tuning of the bfloat16 weights, 2 prompts x 4 completions, 8 new
  tokens, beta 0, 2 steps;
- ``grpo_lora``: the same with a PEFT LoRA of rank 8 on every projection;
- ``nesgpu``: ``nesgpu train --task generation`` (``NESGPU_ARGS`` below, plus ``--nesgpu-arg``), 2 steps.

For each method the sizes are run from the smallest up, one process at a time, and a method stops going up
after its first failure (killed for memory, a MemoryError or torch's failed allocation, or any other error,
whose reason is recorded). A watchdog kills a run before the machine runs out of memory (``--mem-limit-gb``,
default: all but 1 GB of the machine; or when the machine's available memory falls under 0.5 GB), so the
failure is the run's, not the kernel OOM killer's choice of a process.

The TRL rows run in a separate environment (``--trl-python``, with ``torch==2.13.0 trl peft transformers``),
the others in the project's (``--python``). ``--nesgpu-src PATH`` is put first on PYTHONPATH for the nesgpu
row, to measure another checkout with the same script; ``--label`` names such a row apart (``nesgpu:before``).

    python benchmarks/lm_memory.py                                   # every method, every size
    python benchmarks/lm_memory.py --methods nesgpu --sizes 0.5B --nesgpu-src /tmp/base/src --label before
    python benchmarks/lm_memory.py --methods nesgpu --sizes 0.5B,1.5B --nesgpu-arg=--chunk-size --nesgpu-arg=4

Results are merged into ``benchmarks/results/lm_memory_cpu.json`` (a rerun replaces the rows of the same
method, label and size) and printed as a markdown table: per size, each method's peak RSS in GB and its
ratio to plain inference at that size.

The workers (the model's creation, inference and the two GRPO rows) are in ``lm_memory_workers.py``, which each
measured process runs; its names stay importable from here (``benchmarks/lm_memory_gpu.py`` uses them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lm_memory_workers import (  # noqa: E402,F401  (re-exported: lm_memory_gpu.py uses them as lm_memory.*)
    GENERATIONS, LORA_TARGETS, NEW_TOKENS, PROMPTS_PER_STEP, REWARD, ROWS, SIZES, STEPS, WORKERS, load_reward,
    prompt_rows, run_worker, worker_create, worker_grpo, worker_inference, write_data,
)

REPO = Path(__file__).resolve().parents[1]
WORKER_SCRIPT = Path(__file__).resolve().with_name("lm_memory_workers.py")  # run by each measured process
GB = 1e9  # decimal gigabytes throughout

METHODS = ("inference", "grpo", "grpo_lora", "nesgpu")
NOTES = {
    "inference": f"AutoModelForCausalLM.from_pretrained(dtype=bfloat16), generate() of {ROWS} rows, {NEW_TOKENS} new "
                 f"tokens, greedy, {STEPS} times; the weights are memory-mapped safetensors pages (file-backed, "
                 f"counted "
                 "in RSS once touched: an untied input embedding only at the rows looked up)",
    "grpo": f"TRL GRPOTrainer, full fine-tuning of the bf16 weights, {PROMPTS_PER_STEP} prompts x {GENERATIONS} "
            f"completions, {NEW_TOKENS} new tokens, beta 0, {STEPS} steps, lr 1e-4; TRL's defaults otherwise (use_cpu, "
            "bf16 autocast, gradient checkpointing on, adamw_torch_fused: moments in the bf16 params' dtype)",
    "grpo_lora": "as grpo, with PEFT LoRA r=8, alpha 16 on q,k,v,o,gate,up,down_proj (adapters in float32)",
    "nesgpu": "python -m nesgpu + nesgpu_args (+ --nesgpu-arg); the reward adds a < 0.001 tie-breaker from the "
              "completion's characters so that members differ (a step without signal skips the optimizer step)",
}

# The nesgpu row's command line, after ``python -m nesgpu``: edit here as the CLI's defaults change. The
# {placeholders} are filled per run; --nesgpu-arg appends more.
NESGPU_ARGS = [
    "train", "--task", "generation", "--model", "hf:{model}", "--dtype", "bfloat16",
    "--population", "8", "--batch-size", str(PROMPTS_PER_STEP), "--max-new-tokens", str(NEW_TOKENS),
    "--steps", str(STEPS), "--sigma", "0.001", "--lr", "1e-4", "--no-kl",
    "--prompts", "{prompts}", "--eval-prompts", "{eval_prompts}", "--reward", "{reward}:correct",
    "--log", "none", "--progress-every", "0", "--out", "{out}", "--overwrite",
]


# ------------------------------------------------------------------------------------- the orchestrator
def meminfo() -> dict:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        info[key] = int(value.split()[0]) * 1024
    return info


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(command: list[str], env: dict, cwd: Path, log: Path, limit: float, timeout: float) -> dict:
    """Runs ``command`` under ``/usr/bin/time -v`` in a fresh process, alone; kills its processes (not time's)
    if their RSS passes ``limit`` bytes or the machine's available memory falls under 0.5 GB."""
    log.parent.mkdir(parents=True, exist_ok=True)
    timing = log.with_suffix(".time")
    full = ["/usr/bin/time", "-v", "-o", str(timing), *command]
    start = time.perf_counter()
    killed, sampled_peak = None, 0
    with open(log, "w") as out:
        out.write("$ " + " ".join(full) + "\n")
        out.flush()
        proc = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        while proc.poll() is None:
            pids = descendants(proc.pid)
            rss = sum(rss_bytes(p) for p in pids)
            sampled_peak = max(sampled_peak, rss)
            available = meminfo()["MemAvailable"]
            elapsed = time.perf_counter() - start
            if killed is None and (rss > limit or available < 0.5 * GB or elapsed > timeout):
                killed = (f"killed by the watchdog at {rss / GB:.1f} GB RSS: " +
                          (f"over the {limit / GB:.1f} GB limit" if rss > limit else
                           f"machine's available memory {available / GB:.2f} GB" if available < 0.5 * GB else
                           f"over the {timeout:.0f} s timeout"))
                for pid in pids:  # the measured processes; time itself stays to report their peak
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.2)
    wall = time.perf_counter() - start
    text = timing.read_text() if timing.exists() else ""
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    status = re.search(r"Exit status: (\d+)", text)
    signalled = re.search(r"Command terminated by signal (\d+)", text)
    tail = log.read_text(errors="replace").splitlines()[-400:]
    result = {"peak_rss_gb": round(int(peak.group(1)) * 1024 / GB, 2) if peak else None,
              "sampled_peak_rss_gb": round(sampled_peak / GB, 2), "wall_s": round(wall, 1),
              "exit": int(status.group(1)) if status else proc.returncode,
              "signal": int(signalled.group(1)) if signalled else None, "log": str(log)}
    for line in tail:
        if line.startswith("RESULT "):
            result.update(json.loads(line[len("RESULT "):]))
    result["ok"] = killed is None and result["signal"] is None and result["exit"] == 0
    if not result["ok"]:
        result["reason"] = killed or failure_reason(tail, result["signal"], result["exit"])
    return result


def failure_reason(tail: list[str], sig: int | None, code: int) -> str:
    text = "\n".join(tail)
    if "MemoryError" in text or "OutOfMemoryError" in text or "can't allocate memory" in text:
        line = next((l for l in reversed(tail) if "Memory" in l or "allocate" in l), "")
        return "out of memory: " + line.strip()[:300]
    if sig == 9:
        return "killed by SIGKILL (the kernel's OOM killer?)"
    if sig is not None:
        return f"killed by signal {sig}"
    last = next((l for l in reversed(tail) if l.strip() and not l.startswith(("RESULT", "\t"))), "")
    return f"exit status {code}: {last.strip()[:300]}"


def ensure_model(size: str, args, limit: float) -> Path:
    model = Path(args.root) / "models" / f"qwen2-{size}"
    if (model / "config.json").exists():
        return model
    print(f"creating {model} (random weights, bfloat16)", flush=True)
    result = measure([args.python, str(WORKER_SCRIPT), "--worker", "create", "--size", size, "--model", str(model)],
                     worker_env(None), REPO, Path(args.root) / "logs" / f"create-{size}.log", limit, 3600)
    if not result["ok"]:
        raise SystemExit(f"could not create {model}: {result['reason']} (log: {result['log']})")
    print(f"  {result['params'] / 1e9:.2f}B parameters, {result['wall_s']} s, peak {result['peak_rss_gb']} GB")
    return model


def worker_env(pythonpath: str | None) -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def command_for(method: str, size: str, model: Path, data: dict, args) -> tuple[list[str], dict, Path]:
    if method == "nesgpu":
        out = Path(args.root) / "out" / f"nesgpu-{args.label or 'src'}-{size}"
        fill = dict(data, model=model, out=out)
        argv = [a.format(**fill) for a in NESGPU_ARGS] + list(args.nesgpu_arg)
        return [args.python, "-m", "nesgpu", *argv], worker_env(args.nesgpu_src), out
    python = args.trl_python if method.startswith("grpo") else args.python
    return ([python, str(WORKER_SCRIPT), "--worker", method, "--model", str(model), "--reward", data["reward"]],
            worker_env(None), None)


def row_key(row: dict) -> tuple:
    return row["method"], row["size"]


def short_reason(row: dict) -> str:
    """A failure in a few words, for the table (the JSON has the whole reason)."""
    reason = row["reason"]
    if reason.startswith("killed by the watchdog") and "timeout" not in reason:
        return f"out of memory (killed at {row['peak_rss_gb']} GB)"
    if reason.startswith(("out of memory", "killed by SIGKILL")):
        return f"out of memory (peak {row['peak_rss_gb']} GB)"
    return reason[:60]


def table(rows: list[dict]) -> str:
    methods = []
    for row in rows:
        if row["method"] not in methods:
            methods.append(row["method"])
    methods.sort(key=lambda m: (METHODS.index(m.split(":")[0]) if m.split(":")[0] in METHODS else 99, m))
    cell = {row_key(r): r for r in rows}
    lines = ["| size | " + " | ".join(f"{m} GB (x inference)" if m != "inference" else "inference GB"
                                      for m in methods) + " |",
             "|---|" + "---|" * len(methods)]
    for size in SIZES:
        if not any((m, size) in cell for m in methods):
            continue
        base = cell.get(("inference", size))
        base_gb = base["peak_rss_gb"] if base and base["ok"] else None
        out = []
        for m in methods:
            r = cell.get((m, size))
            if r is None:
                out.append("")
            elif not r["ok"]:
                out.append(f"failed: {short_reason(r)}")
            elif m == "inference" or base_gb is None:
                out.append(f"{r['peak_rss_gb']:.2f}")
            else:
                out.append(f"{r['peak_rss_gb']:.2f} (x{r['peak_rss_gb'] / base_gb:.1f})")
        lines.append(f"| {size} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--root", default=str(REPO / "runs" / "mem"), help="models, data, logs and run dirs")
    parser.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"), help="nesgpu's environment")
    parser.add_argument("--trl-python", default=str(REPO / ".venv-trl" / "bin" / "python"), help="TRL's")
    parser.add_argument("--nesgpu-src", help="put first on PYTHONPATH for the nesgpu row (another checkout's src)")
    parser.add_argument("--nesgpu-arg", action="append", default=[],
                        help="one more argument for the nesgpu command line (repeatable; --nesgpu-arg=--flag)")
    parser.add_argument("--label", help="the nesgpu row's name is nesgpu:LABEL (a before/after pair)")
    parser.add_argument("--mem-limit-gb", type=float, help="kill a run above this RSS (default: all but 1 GB)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a run may take")
    parser.add_argument("--keep-going", action="store_true", help="run the larger sizes after a failure too")
    parser.add_argument("--keep-runs", action="store_true", help="keep the nesgpu run directories")
    parser.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "lm_memory_cpu.json"))
    args = parser.parse_args()
    args.methods = [m.strip() for m in args.methods.split(",")]
    args.sizes = [s.strip() for s in args.sizes.split(",")]
    for m in args.methods:
        if m not in METHODS:
            parser.error(f"unknown method {m!r}; of {METHODS}")
    for s in args.sizes:
        if s not in SIZES:
            parser.error(f"unknown size {s!r}; of {tuple(SIZES)}")
    args.sizes.sort(key=list(SIZES).index)
    return args


def main() -> None:
    args = parse_args()
    methods, sizes = args.methods, args.sizes
    total = meminfo()["MemTotal"]
    limit = args.mem_limit_gb * GB if args.mem_limit_gb else total - 1 * GB
    data = write_data(Path(args.root))
    path = Path(args.json)
    saved = json.loads(path.read_text()) if path.exists() else {"runs": []}
    rows = {row_key(r): r for r in saved["runs"]}

    for method in methods:
        name = f"{method}:{args.label}" if method == "nesgpu" and args.label else method
        for size in sizes:
            model = ensure_model(size, args, limit)
            command, env, out = command_for(method, size, model, data, args)
            info = meminfo()
            print(f"{name} {size}: available {info['MemAvailable'] / GB:.1f} of {total / GB:.1f} GB", flush=True)
            if info["MemAvailable"] < total - 3 * GB:
                print(f"  warning: {(total - info['MemAvailable']) / GB:.1f} GB in use by other processes", flush=True)
            log = Path(args.root) / "logs" / f"{name.replace(':', '-')}-{size}.log"
            result = measure(command, env, REPO, log, limit, args.timeout)
            row = {"method": name, "size": size, **result, "command": command,
                   "pythonpath": env.get("PYTHONPATH"),
                   "mem_available_gb_at_start": round(info["MemAvailable"] / GB, 1),
                   "when": time.strftime("%Y-%m-%d %H:%M:%S")}
            if out is not None and not args.keep_runs:
                shutil.rmtree(out, ignore_errors=True)
            rows[(name, size)] = row
            print(f"  {'ok' if row['ok'] else 'FAILED: ' + row['reason']}; peak {row['peak_rss_gb']} GB, "
                  f"{row['wall_s']} s", flush=True)
            saved = {"description": "peak RSS (/usr/bin/time -v) of a fresh process per method and size; "
                                    "benchmarks/lm_memory.py", "methods": NOTES, "nesgpu_args": NESGPU_ARGS,
                     "machine": {"cpus": os.cpu_count(), "mem_total_gb": round(total / GB, 1),
                                 "python": platform.python_version(), "platform": platform.platform()},
                     "runs": sorted(rows.values(), key=lambda r: (r["method"], list(SIZES).index(r["size"])))}
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(saved, indent=1) + "\n")
            if not row["ok"] and not args.keep_going:
                break
    print()
    print(table(saved["runs"]))


if __name__ == "__main__":
    main()
