"""Forward-pass benchmark of the perturbed layers: the three tables of the original NESgpu README.

For each layer size, every perturbed layer evaluates a population of P members, one input row per
member (R = 1 repeat of D = P directions), in one batched call ``pm(x)``. Two references:

- Base: the plain nn.Linear / nn.Conv2d on the same (P, ...) batch, under no_grad (the cost of the
  forward without any perturbation; a lower bound for the population forward).
- Naive: the plain layer on batch size 1, P times in a Python loop (an implementation that evaluates
  the members one by one). The loop is timed over ``naive_rows`` rows and scaled by P / naive_rows.

Tables: median time (ms), speed-up vs. Naive (naive / time) and time multiplier vs. Base (time / base),
plus the noise memory of each layer kind (its ``_noise`` tensors after ``set_noise``, in MiB).

    python benchmarks/layer_speed.py --which linear --device cpu --json out.json   # --help for the options
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from nesgpu.layers import (
    FlipoutConv2d,
    FlipoutLinear,
    LowRankConv2d,
    LowRankLinear,
    PermutedConv2d,
    PermutedLinear,
    PerturbedConv2d,
    PerturbedLinear,
    PerturbedModule,
    SparsePerturbedLinear,
)
from nesgpu.model import PerturbedModel
from nesgpu.version import __version__

# ----- what is measured -----------------------------------------------------------------------------
# (out, in)
LINEAR_SIZES = [(256, 256), (512, 512), (1024, 1024)]
# (out_channels, in_channels, kernel, input H x W); padding = kernel // 2, stride 1
CONV_SIZES = [
    (16, 16, (3, 3), (64, 64)),
    (32, 32, (3, 3), (64, 64)),
    (64, 64, (3, 3), (32, 32)),
    (32, 32, (1, 1), (32, 32)),
    (1024, 1024, (1, 1), (1, 1)),
]
# --quick drops the two 64 x 64 inputs: on a CPU they cost seconds per call for every row
QUICK_CONV_SIZES = [CONV_SIZES[2], CONV_SIZES[3], CONV_SIZES[4]]

# (row label, layer class, options)
LINEAR_ROWS = [
    ("PerturbedLinear", PerturbedLinear, {}),
    ("SparsePerturbedLinear (k=1)", SparsePerturbedLinear, {"k": 1}),
    ("SparsePerturbedLinear (k=2)", SparsePerturbedLinear, {"k": 2}),
    ("PermutedLinear", PermutedLinear, {}),
    ("PermutedLinear(in_sparsity=.5)", PermutedLinear, {"in_sparsity": 0.5}),
    ("PermutedLinear(in_sparsity=.1)", PermutedLinear, {"in_sparsity": 0.1}),
    ("FlipoutLinear", FlipoutLinear, {}),
    ("LowRankLinear (rank=1)", LowRankLinear, {"rank": 1}),
    ("LowRankLinear (rank=4)", LowRankLinear, {"rank": 4}),
]
CONV_ROWS = [
    ("PerturbedConv2d", PerturbedConv2d, {}),
    ("PermutedConv2d", PermutedConv2d, {}),
    ("PermutedConv2d(out_sparsity=.5)", PermutedConv2d, {"out_sparsity": 0.5}),
    ("PermutedConv2d(out_sparsity=.1)", PermutedConv2d, {"out_sparsity": 0.1}),
    ("FlipoutConv2d", FlipoutConv2d, {}),
    ("LowRankConv2d", LowRankConv2d, {}),
]
ROWS = {"linear": LINEAR_ROWS, "conv": CONV_ROWS}
BASE, NAIVE = "Base", "Naive"
SIGMA = 0.1  # any value: the forward's cost does not depend on it


def size_label(size) -> str:
    """The seed's column header: (256, 256) or (16, 16, (3, 3), (64, 64))."""
    return str(tuple(size))


# ----- timing -------------------------------------------------------------------------------------
def time_call(fn: Callable[[], object], repeats: int, warmup: int, device: torch.device | str) -> float:
    """Median wall time of ``fn()`` in ms over ``repeats`` calls, after ``warmup`` untimed calls.

    On CUDA the device is synchronized before and after each call, so a time covers the kernels."""
    cuda = torch.device(device).type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def noise_mib(layer: PerturbedModule) -> float:
    """Memory of the layer's current noise tensors in MiB."""
    return layer.noise_bytes() / 2**20


# ----- one table ----------------------------------------------------------------------------------
def make_layer(kind: str, cls: type[nn.Module], options: dict, size, population: int | None, device) -> nn.Module:
    """A layer of ``kind`` ("linear" / "conv") and ``size``: ``cls`` is nn.Linear / nn.Conv2d or a perturbed
    class (then built with ``directions=population`` and ``options``)."""
    extra = {} if population is None else options
    if kind == "linear":
        out_features, in_features = size
        return cls(in_features, out_features, device=device, **extra)
    out_channels, in_channels, kernel, _ = size
    padding = tuple(k // 2 for k in kernel)
    return cls(in_channels, out_channels, kernel, padding=padding, device=device, **extra)


def make_input(kind: str, size, population: int, device) -> torch.Tensor:
    """The population batch: (P, in) for Linear, (P, C_in, H, W) for Conv2d."""
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (population, size[1]) if kind == "linear" else (population, size[1], *size[3])
    return torch.randn(shape, generator=gen, device=device)


def bench_size(kind: str, size, population: int, repeats: int, warmup: int, device, naive_rows: int,
               log: Callable[[str], None] = lambda msg: None) -> tuple[dict[str, float], dict[str, float]]:
    """Time every row of ``kind`` at one size. Returns ({row: median ms}, {row: noise MiB})."""
    x = make_input(kind, size, population, device)
    ms, mib = {}, {}
    for label, cls, options in ROWS[kind]:
        layer = make_layer(kind, cls, options, size, population, device)
        # the permuted kind needs antithetic pairs: the same P rows are then 2 repeats of P / 2 directions
        antithetic = layer.needs_antithetic
        pm = PerturbedModel(layer, directions=population // 2 if antithetic else population, sigma=SIGMA,
                                   antithetic=antithetic)
        pm.set_noise()  # once, outside the timer
        mib[label] = noise_mib(layer)
        ms[label] = time_call(lambda: pm(x), repeats, warmup, device)
        log(f"  {label:<34} {ms[label]:10.3f} ms  noise {mib[label]:9.2f} MiB")
        pm.free_memory()  # free the noise before the next row

    plain = make_layer(kind, nn.Linear if kind == "linear" else nn.Conv2d, {}, size, None, device).eval()
    singles = list(x[: min(naive_rows, population)].split(1))  # batch-size-1 inputs, sliced outside the timer
    with torch.no_grad():
        ms[BASE] = time_call(lambda: plain(x), repeats, warmup, device)
        loop_ms = time_call(lambda: [plain(xi) for xi in singles], repeats, warmup, device)
    ms[NAIVE] = loop_ms * population / len(singles)
    log(f"  {BASE:<34} {ms[BASE]:10.3f} ms")
    log(f"  {NAIVE:<34} {ms[NAIVE]:10.3f} ms  ({len(singles)} rows timed, scaled x{population / len(singles):g})")
    return ms, mib


def ratios(ms: dict[str, dict[str, float]]) -> tuple[dict, dict]:
    """({row: {size: naive / time}}, {row: {size: time / base}}) from {row: {size: ms}}."""
    speedup = {row: {s: ms[NAIVE][s] / t for s, t in cells.items()} for row, cells in ms.items()}
    vs_base = {row: {s: t / ms[BASE][s] for s, t in cells.items()} for row, cells in ms.items()}
    return speedup, vs_base


def bench_table(kind: str, sizes, population: int, repeats: int, warmup: int, device, naive_rows: int,
                log: Callable[[str], None] = lambda msg: None) -> dict:
    """Benchmark all rows of ``kind`` ("linear" or "conv") at all ``sizes``; values keyed [row][size label]."""
    rows = [label for label, _, _ in ROWS[kind]] + [BASE, NAIVE]
    ms = {row: {} for row in rows}
    mib = {row: {} for row in rows[:-2]}
    for size in sizes:
        label = size_label(size)
        log(f"{kind} {label}")
        t0 = time.perf_counter()
        size_ms, size_mib = bench_size(kind, size, population, repeats, warmup, device, naive_rows, log)
        log(f"  ({time.perf_counter() - t0:.1f} s)")
        for row in rows:
            ms[row][label] = size_ms[row]
        for row in mib:
            mib[row][label] = size_mib[row]
    speedup, vs_base = ratios(ms)
    return {
        "kind": kind,
        "sizes": [size_label(s) for s in sizes],
        "repeats": repeats,
        "warmup": warmup,
        "ms": ms,
        "speedup_vs_naive": speedup,
        "time_vs_base": vs_base,
        "noise_mib": mib,
    }


# ----- the whole benchmark ------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(which: str = "all", device: str | torch.device = "cpu", population: int = 1024,
        linear_sizes=None, conv_sizes=None, linear_repeats: int = 20, conv_repeats: int = 20, warmup: int = 3,
        naive_rows: int = 64, quick: bool = False, log: Callable[[str], None] = lambda msg: None) -> dict:
    """Run the linear and/or conv tables. Returns ``{"meta": {...}, "tables": {"linear": ..., "conv": ...}}``."""
    device = torch.device(device)
    linear_sizes = LINEAR_SIZES if linear_sizes is None else linear_sizes
    conv_sizes = CONV_SIZES if conv_sizes is None else conv_sizes
    naive_rows = min(naive_rows, population)
    meta = {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "nesgpu": __version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "threads": torch.get_num_threads(),
        "population": population,
        "repeats": {"linear": linear_repeats, "conv": conv_repeats},
        "warmup": warmup,
        "naive_rows": naive_rows,
        "quick": quick,
        "notes": [
            f"Time: median of the repeats, after {warmup} warm-up call(s); the population forward only "
            f"(set_noise once, outside the timer), {population} rows = {population} directions x 1 repeat.",
            "Base: the plain nn.Linear / nn.Conv2d on the same batch under torch.no_grad (as the population "
            "forward). Conv2d: stride 1, padding kernel // 2, float32.",
            f"Naive: the plain layer on batch size 1 in a Python loop; {naive_rows} rows timed, scaled by "
            f"{population}/{naive_rows}." if naive_rows < population else
            f"Naive: the plain layer on batch size 1 in a Python loop over all {population} rows.",
            "Noise memory: the layer's noise tensors after set_noise (numel * element_size), MiB.",
        ],
    }
    tables = {}
    t0 = time.perf_counter()
    if which in ("linear", "all"):
        tables["linear"] = bench_table("linear", linear_sizes, population, linear_repeats, warmup, device,
                                       naive_rows, log)
    if which in ("conv", "all"):
        tables["conv"] = bench_table("conv", conv_sizes, population, conv_repeats, warmup, device, naive_rows, log)
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    return {"meta": meta, "tables": tables}


# ----- output -------------------------------------------------------------------------------------
def markdown_table(title: str, values: dict[str, dict[str, float]], sizes: list[str], fmt: str) -> str:
    lines = [f"**{title}**", "", "| | " + " | ".join(sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for row, cells in values.items():
        lines.append(f"| {row} | " + " | ".join(format(cells[s], fmt) if s in cells else "-" for s in sizes) + " |")
    return "\n".join(lines)


TABLE_NAMES = {"linear": "Linear, (out, in)", "conv": "Conv2d, (out_channels, in_channels, kernel, input size)"}


def render_markdown(results: dict) -> str:
    """Markdown for :func:`run`'s results: a header and, per layer family, time / speed-up / vs. base /
    noise-memory tables."""
    meta = results["meta"]
    out = [
        "## Layer forward benchmark",
        "",
        f"Device: {meta['device_name']} ({meta['device']}), torch {meta['torch']}, {meta['threads']} CPU threads, "
        f"population {meta['population']}, {meta['date']}" + (", --quick" if meta.get("quick") else "") + ".",
        "",
        *[f"- {note}" for note in meta["notes"]],
    ]
    for kind, table in results["tables"].items():
        sizes = table["sizes"]
        out += ["", f"### {TABLE_NAMES[kind]}", "",
                f"Median of {table['repeats']} runs, after {table['warmup']} warm-up run(s).", ""]
        out += [markdown_table("Time (ms, lower is better)", table["ms"], sizes, ".3f"), ""]
        out += [markdown_table("Speed multiplier vs. naive (higher is better)", table["speedup_vs_naive"], sizes,
                               ".2f"), ""]
        out += [markdown_table("Time multiplier vs. base (lower is better)", table["time_vs_base"], sizes, ".2f"), ""]
        out += [markdown_table(f"Noise memory (MiB, population {meta['population']})", table["noise_mib"], sizes,
                               ".2f")]
    return "\n".join(out) + "\n"


# ----- command line -------------------------------------------------------------------------------
def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def output_file(text: str) -> str:
    """A file the results can be written to, checked before the benchmark runs (not after it)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; expected a file to write")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path.parent} does not exist; expected a file in an existing directory")
    return text


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer; got {text}")
    return value


def linear_size(text: str) -> tuple[int, int]:
    """OUTxIN, e.g. 256x256."""
    try:
        out_f, in_f = (positive_int(v) for v in text.lower().split("x"))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected OUTxIN with positive integers, e.g. 256x256; got {text!r}")
    return out_f, in_f


def conv_size(text: str) -> tuple[int, int, tuple[int, int], tuple[int, int]]:
    """OUTxINxKxHW (square kernel and input), e.g. 16x16x3x64 for (16, 16, (3, 3), (64, 64))."""
    try:
        out_c, in_c, k, hw = (positive_int(v) for v in text.lower().split("x"))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected OUTxINxKxHW with positive integers, e.g. 16x16x3x64; got {text!r}")
    return out_c, in_c, (k, k), (hw, hw)


def parser() -> argparse.ArgumentParser:
    """The script's command line (whole flag names only)."""
    p = argparse.ArgumentParser(
        prog="benchmarks/layer_speed.py", allow_abbrev=False,
        description="Forward-pass benchmark of the perturbed layers (the tables of the original NESgpu README). "
                    "Markdown tables go to stdout, progress to stderr.")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda if available, else cpu")
    p.add_argument("--which", choices=["linear", "conv", "all"], default="all",
                   help="which layer family (default: all)")
    p.add_argument("--population", type=positive_int, default=1024,
                   help="population size P, one row per member (default: 1024)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="timed runs per cell, median reported (default: 20; 5 linear / 2 conv with --quick)")
    p.add_argument("--warmup", type=non_negative_int, default=None,
                   help="untimed runs before timing (default: 3; 1 with --quick)")
    p.add_argument("--naive-rows", type=positive_int, default=64,
                   help="rows of the naive loop actually timed; the time is scaled to the population (default: 64)")
    p.add_argument("--quick", action="store_true",
                   help="fewer runs (5 linear / 2 conv, 1 warm-up) and only the Conv2d sizes with 32x32 or smaller "
                        "inputs; explicit --repeats / --warmup / --conv-sizes win")
    p.add_argument("--linear-sizes", type=linear_size, nargs="+", metavar="OUTxIN", default=None,
                   help="Linear sizes (default: 256x256 512x512 1024x1024)")
    p.add_argument("--conv-sizes", type=conv_size, nargs="+", metavar="OUTxINxKxHW", default=None,
                   help="Conv2d sizes, square kernel K and input HW (default: 16x16x3x64 32x32x3x64 64x64x3x32 "
                        "32x32x1x32 1024x1024x1x1)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="also write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", type=output_file, help="also write the Markdown tables to a file")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run, print Markdown, write --json / --markdown."""
    p = parser()
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    linear_repeats = conv_repeats = args.repeats or 20
    if args.quick and args.repeats is None:
        linear_repeats, conv_repeats = 5, 2
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    conv_sizes = args.conv_sizes or (QUICK_CONV_SIZES if args.quick else CONV_SIZES)

    results = run(args.which, args.device, args.population, args.linear_sizes, conv_sizes, linear_repeats,
                  conv_repeats, warmup, args.naive_rows, args.quick,
                  log=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.quick and args.conv_sizes is None and args.which != "linear":
        skipped = ", ".join(size_label(s) for s in CONV_SIZES if s not in QUICK_CONV_SIZES)
        results["meta"]["notes"].append(f"--quick: Conv2d sizes {skipped} skipped.")
    text = render_markdown(results)
    print(text, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
