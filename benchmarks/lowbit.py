"""Low-bit layers: what a population step of a binary / int8 Linear costs next to the float layer, which product
wins where, and what ES learns with them on digits.

``layers``: one Linear of each size, population rows (2 signs x B samples x D directions, a hidden layer's
input: every row its own). Per round, interleaved, each variant draws a step's noise and runs the population
forward (the plain floor runs the forward only, on the same rows, with the float weight):
- float plain: F.linear on all rows (plain inference of the same rows: the floor);
- float lowrank / gaussian: PerturbedLinear;
- b1 / i8 latent (gaussian | lowrank noise): each member quantises its own perturbed weights (LowBitLinear);
- b1 / i8 quantized (lowrank noise): the noise rides in float on the shared quantised weights;
- ... W8A8 / W1A8 (act_bits=8): the same with the inputs quantised per row and the shared product as an
  int8 GEMM; "i8 W8A8 plain forward" is the unperturbed int8 layer (plain inference of the low-bit model).
Then the products a shared low-bit base could use for those rows (the base of noise_on="quantized"):
- float GEMM with the dequantised weights (what nesgpu runs);
- int8 GEMM (torch._int_mm, weights and activations int8, the activations quantised per row first: W8A8);
- bf16 x int8 weights (torch.ops.aten._weight_int8pack_mm, weight-only int8);
- XNOR-popcount on bit-packed +-1 weights and activations (a lookup-table popcount in torch: binary inputs only).

``learn``: ``nesgpu train`` on digits (its defaults, 1000 steps) as float ES and with --bits 1 / 8 and both noise
placements, for each seed; test accuracy and wall time, one run per core (OMP_NUM_THREADS=1).

Run: python benchmarks/lowbit.py layers [--rounds 7] [--device cpu]
     python benchmarks/lowbit.py learn [--seeds 0 1 2] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import nesgpu
from layer_speed import time_call
from nesgpu.quantize import codes, quantize

CONFIGS = {
    "float ES": [],
    "b1 latent": ["--bits", "1"],
    "b1 quantized": ["--bits", "1", "--noise-on", "quantized"],
    "i8 latent": ["--bits", "8"],
    "i8 quantized": ["--bits", "8", "--noise-on", "quantized"],
    "i8 W8A8 latent": ["--bits", "8", "--act-bits", "8"],
    "i8 W8A8 quantized": ["--bits", "8", "--noise-on", "quantized", "--act-bits", "8"],
    "b1 W1A8 quantized": ["--bits", "1", "--noise-on", "quantized", "--act-bits", "8"],
}
"""The learn runs by name: nesgpu train options over the task's defaults."""
SIZES = [(64, 64, 256, 128), (256, 256, 128, 32), (1024, 1024, 32, 16)]  # in, out, directions, samples


def population_variant(x, n_out, directions, device, bits=None, noise_on="latent", kind="lowrank", act_bits=None):
    """One step of a population layer on rows x: draw the noise, run the forward."""
    n_in = x.shape[1]
    torch.manual_seed(0)
    layer = nesgpu.convert(nn.Linear(n_in, n_out), kind, bits=bits, noise_on=noise_on, act_bits=act_bits) if bits \
        else nesgpu.convert(nn.Linear(n_in, n_out), kind)
    pm = nesgpu.PerturbedModel(layer.to(device), directions, sigma=0.05, antithetic=True)
    step = [0]

    def run():
        step[0] += 1
        pm.set_noise(step=step[0])
        return pm(x)

    return run


def xnor_popcount(xp: torch.Tensor, wp: torch.Tensor, k: int, table: torch.Tensor, block: int = 256) -> torch.Tensor:
    """sum_i x_i w_i for +-1 vectors packed 8 per byte: k - 2 popcount(x xor w), in blocks of rows."""
    out = torch.empty(xp.shape[0], wp.shape[0], dtype=torch.int32, device=xp.device)
    for i in range(0, xp.shape[0], block):
        diff = table[(xp[i:i + block, None, :] ^ wp[None]).int()].sum(-1, dtype=torch.int32)
        out[i:i + block] = k - 2 * diff
    return out


def pack_signs(t: torch.Tensor) -> torch.Tensor:
    """+-1 (>= 0 -> bit 1) along the last dimension, 8 per uint8."""
    bits = (t >= 0).to(torch.uint8).view(*t.shape[:-1], -1, 8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=t.device)
    return (bits * weights).sum(-1, dtype=torch.uint8)


def variants_for(n_in: int, n_out: int, directions: int, samples: int, device: torch.device,
                 table: torch.Tensor) -> dict:
    """Every variant's callable for one layer size (see the module docstring)."""
    rows = 2 * samples * directions
    x = torch.randn(rows, n_in, device=device)
    w = torch.randn(n_out, n_in, device=device) / n_in ** 0.5
    q8, s8 = codes(w, 8, 1)
    w8 = quantize(w, 8, 1)
    qx = codes(x, 8, 1)[0]
    w8a8_layer = nesgpu.LowBitLinear(n_in, n_out, bias=False, bits=8, act_bits=8).to(device)
    variants = {
        "float plain": lambda: F.linear(x, w),
        "float lowrank": population_variant(x, n_out, directions, device),
        "float gaussian": population_variant(x, n_out, directions, device, kind="gaussian"),
        "b1 latent (gaussian)": population_variant(x, n_out, directions, device, 1, kind="gaussian"),
        "b1 latent (lowrank)": population_variant(x, n_out, directions, device, 1),
        "b1 quantized (lowrank)": population_variant(x, n_out, directions, device, 1, "quantized"),
        "i8 latent (lowrank)": population_variant(x, n_out, directions, device, 8),
        "i8 quantized (lowrank)": population_variant(x, n_out, directions, device, 8, "quantized"),
        "i8 quantized W8A8 (lowrank)": population_variant(x, n_out, directions, device, 8, "quantized", act_bits=8),
        "b1 quantized W1A8 (lowrank)": population_variant(x, n_out, directions, device, 1, "quantized", act_bits=8),
        "i8 W8A8 plain forward": lambda: w8a8_layer(x),
        "base: float GEMM, dequantised int8": lambda: F.linear(x, w8),
    }

    def w8a8():
        q, sx = codes(x, 8, 1)
        return torch._int_mm(q, q8.t()).float() * sx * s8.view(1, -1)

    variants["base: int8 GEMM (W8A8, _int_mm)"] = w8a8
    variants["base: int8 GEMM without quantising x"] = lambda: torch._int_mm(qx, q8.t())
    if hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        xb, sb = x.bfloat16(), s8.view(-1).bfloat16()
        variants["base: bf16 x int8 weights (_weight_int8pack_mm)"] = (
            lambda: torch.ops.aten._weight_int8pack_mm(xb, q8, sb))
    if n_in % 8 == 0:
        xp, wp = pack_signs(x), pack_signs(w)
        variants["base: XNOR-popcount (binary x and w)"] = lambda: xnor_popcount(xp, wp, n_in, table)
    return variants


def layers(args) -> None:
    device = torch.device(args.device)
    table = torch.tensor([i.bit_count() for i in range(256)], dtype=torch.int32, device=device)
    results = []
    for n_in, n_out, directions, samples in SIZES:
        rows = 2 * samples * directions
        variants = variants_for(n_in, n_out, directions, samples, device, table)
        times = {name: [] for name in variants}
        for fn in variants.values():
            fn()  # warm up (and build the members' first noise)
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(time_call(fn, 1, 0, device) / 1e3)  # one call, seconds
        floor = statistics.median(times["float plain"])
        print(f"\nLinear {n_in}->{n_out}, {directions} directions x 2 signs x {samples} samples = {rows} rows "
              f"({args.device}, median of {args.rounds})")
        print("| variant | ms | / float plain |\n|---|---:|---:|")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"| {name} | {med * 1e3:.2f} | {med / floor:.2f} |")
            results.append(dict(size=f"{n_in}x{n_out}", directions=directions, samples=samples, variant=name,
                                ms=med * 1e3, ratio=med / floor))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def learn(args) -> None:
    configs = {name: CONFIGS[name] for name in args.configs}
    jobs = [(name, seed) for seed in args.seeds for name in configs]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results: dict[str, list] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        running: list = []
        pending = list(jobs)
        while pending or running:
            while pending and len(running) < args.jobs:
                name, seed = pending.pop(0)
                out = Path(tmp) / f"{name.replace(' ', '-')}-{seed}"
                cmd = [sys.executable, "-m", "nesgpu", "train", "--seed", str(seed), "--out", str(out),
                       "--progress-every", "0", "--log", "none", *configs[name], *args.extra]
                running.append((name, seed, out, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)))
            time.sleep(1)
            for job in list(running):
                name, seed, out, proc = job
                if proc.poll() is not None:
                    running.remove(job)
                    if proc.returncode:
                        raise SystemExit(f"{name} seed {seed} failed ({proc.returncode})")
                    summary = json.loads((out / "summary.json").read_text())
                    results[name].append((seed, summary["value"], summary["seconds"]))
                    print(f"{name} seed {seed}: {summary['value']:.4f} in {summary['seconds']:.1f} s", flush=True)
    first = next(iter(results))  # the baseline: the first config (float ES by default)
    base = statistics.mean(v for _, v, _ in results[first])
    base_s = statistics.median(s for _, _, s in results[first])
    print(f"\n| model | test accuracy per seed | mean | mean - {first} | median seconds | / {first} |")
    print("|---|---|---:|---:|---:|---:|")
    for name, rows in results.items():
        rows.sort()
        mean = statistics.mean(v for _, v, _ in rows)
        sec = statistics.median(s for _, _, s in rows)
        print(f"| {name} | {' / '.join(f'{v:.4f}' for _, v, _ in rows)} | {mean:.4f} | {mean - base:+.4f} | "
              f"{sec:.1f} | {sec / base_s:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("layers")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json")
    p = sub.add_parser("learn")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), metavar="NAME",
                   default=["float ES", "b1 latent", "b1 quantized", "i8 latent", "i8 quantized"],
                   help=f"runs to make, the first the baseline: {', '.join(CONFIGS)}")
    p.add_argument("--json")
    p.add_argument("extra", nargs="*", help="more nesgpu train options (after --)")
    args = parser.parse_args()
    layers(args) if args.command == "layers" else learn(args)


if __name__ == "__main__":
    main()
