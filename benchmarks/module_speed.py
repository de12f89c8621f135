"""Forward-pass benchmark of the module families beyond Linear / Conv2d: a transformer block,
Embedding, LayerNorm, Conv1d, LSTM, and the torch.func fallback.

Each row times the population forward of the converted module on P rows (R = 2 antithetic repeats of
P / 2 directions, ``set_noise`` outside the timer) against the plain module on the same P rows under
no_grad, in the same run, and reports the ratio. For the transformer block the plain time is the faster
of torch's fused inference path and its unfused path. Run it as ``python benchmarks/module_speed.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable

import torch
from torch import nn

from nesgpu.conversion import convert
from nesgpu.kinds import KINDS
from nesgpu.model import PerturbedModel
from layer_speed import device_name, output_file, positive_int, time_call


class Scale(nn.Module):
    """A module with a bare parameter: it can only run through the exact torch.func fallback."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * self.weight


def _tokens(p, gen, device):
    return torch.randint(0, 1000, (p, 64), generator=gen, device=device)


# name -> (module factory, input factory (P, generator, device) -> input)
MODULES: dict[str, tuple[Callable[[], nn.Module], Callable]] = {
    "TransformerEncoderLayer (d 128, 4 heads, seq 64)": (
        lambda: nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True).eval(),
        lambda p, g, dev: torch.randn(p, 64, 128, generator=g, device=dev)),
    "Embedding (1000 x 128, seq 64)": (lambda: nn.Embedding(1000, 128), _tokens),
    "LayerNorm (128, seq 64)": (lambda: nn.LayerNorm(128),
                                lambda p, g, dev: torch.randn(p, 64, 128, generator=g, device=dev)),
    "Conv1d (32 -> 32, k 5, length 128)": (lambda: nn.Conv1d(32, 32, 5, padding=2),
                                           lambda p, g, dev: torch.randn(p, 32, 128, generator=g, device=dev)),
    "LSTM (32 -> 64, seq 16)": (lambda: nn.LSTM(32, 64, batch_first=True),
                                lambda p, g, dev: torch.randn(p, 16, 32, generator=g, device=dev)),
    "fallback: bare parameter (128, seq 64)": (lambda: Scale(128),
                                               lambda p, g, dev: torch.randn(p, 64, 128, generator=g, device=dev)),
}


def run(population: int = 256, kinds=("lowrank", "gaussian"), repeats: int = 10, warmup: int = 2,
        device: str = "cpu", log: Callable[[str], None] = lambda msg: None) -> dict:
    """Times every module x kind. Returns {"meta": ..., "rows": [{module, kind, plain_ms, es_ms, ratio, noise_mib}]}."""
    if population % 2:
        raise ValueError(f"population must be even (antithetic pairs); got {population}")
    device = torch.device(device)
    rows = []
    for name, (factory, make_input) in MODULES.items():
        gen = torch.Generator(device=device).manual_seed(0)
        x = make_input(population, gen, device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            plain = factory().to(device)
        with torch.no_grad():
            plain_ms = time_call(lambda: plain(x), repeats, warmup, device)
            if isinstance(plain, nn.TransformerEncoderLayer):  # torch's fused eval path vs its plain path:
                plain.train()  # dropout is 0, so train mode is the same maths through the unfused path
                plain_ms = min(plain_ms, time_call(lambda: plain(x), repeats, warmup, device))
        for kind in kinds:
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                torch.manual_seed(0)
                warnings.simplefilter("ignore")  # the fallback row warns that it is slow: that is measured here
                module = convert(factory(), kind).to(device)
            pm = PerturbedModel(module, population // 2, sigma=0.01, antithetic=True)
            pm.set_noise()
            es_ms = time_call(lambda: pm(x), repeats, warmup, device)
            row = {"module": name, "kind": kind, "plain_ms": plain_ms, "es_ms": es_ms, "ratio": es_ms / plain_ms,
                   "noise_mib": pm.noise_bytes() / 2**20}
            log(f"  {name:<48} {kind:<9} plain {plain_ms:8.2f} ms  ES {es_ms:8.2f} ms  x{row['ratio']:.2f}")
            rows.append(row)
    meta = {"device": str(device), "device_name": device_name(device), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "population": population, "repeats": repeats, "warmup": warmup}
    return {"meta": meta, "rows": rows}


def render_markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [f"Device: {meta['device_name']}, torch {meta['torch']}, {meta['threads']} threads, P = "
             f"{meta['population']} rows (2 antithetic repeats x {meta['population'] // 2} directions), median of "
             f"{meta['repeats']}.", "", "| module | kind | plain ms | ES ms | ES / plain | noise MiB |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results["rows"]:
        lines.append(f"| {r['module']} | {r['kind']} | {r['plain_ms']:.2f} | {r['es_ms']:.2f} | {r['ratio']:.2f} | "
                     f"{r['noise_mib']:.2f} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The script's command line (whole flag names only)."""
    p = argparse.ArgumentParser(prog="benchmarks/module_speed.py", allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--population", type=positive_int, default=256, help="rows P (default: 256)")
    p.add_argument("--kinds", nargs="+", default=["lowrank", "gaussian"], choices=sorted(KINDS))
    p.add_argument("--repeats", type=positive_int, default=10, help="timed calls per row (default: 10)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="also write the results as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    results = run(args.population, args.kinds, args.repeats, device=args.device, log=print)
    print(render_markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
