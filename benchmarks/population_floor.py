"""The supervised ES step against its floor (issue 10): one ES step of the trainer (population forward,
loss, update) against a plain forward of the same rows (every member's minibatch through the unperturbed
model, as one batch), same model, same machine, interleaved rounds.

Cases: the digits default (MLP 64-64-10, population 512, batch 128: 65,536 rows) and the bigger MLP
(64-256-256-10, population 2048, batch 32). Targets: <= 1.5x and <= 1.2x.

Run: python benchmarks/population_floor.py [--rounds 7] [--layer lowrank] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nesgpu.train import TrainConfig
from nesgpu.train.setup.build import build

CASES = {
    "digits default (64-64-10, P=512, B=128)": dict(task="digits"),
    "bigger MLP (64-256-256-10, P=2048, B=32)": dict(task="digits", hidden=(256, 256), population=2048,
                                                     batch_size=32),
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def case(options: dict, layer: str, device: torch.device):
    cfg = TrainConfig.flat(**options, layer=layer, device=str(device)).resolved()
    task, model, pm, step = build(cfg, device, log=lambda *a: None)
    rows = cfg.population * cfg.option("batch_size")
    x, _ = task.batch(1)
    plain_rows = x.repeat(cfg.population, *[1] * (x.dim() - 1))  # the same number of rows, materialised once

    def es_step():
        step.run()  # reads the fitness statistics: the step has run

    @torch.no_grad()
    def plain():
        model(plain_rows).sum().item()

    return es_step, plain, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layer", default="lowrank")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"{args.layer}, {device}, {torch.get_num_threads()} threads, median of {args.rounds} interleaved rounds")
    print("| case | rows | ES step ms | plain forward ms | ratio |\n|---|---:|---:|---:|---:|")
    for name, options in CASES.items():
        es_step, plain, rows = case(options, args.layer, device)
        for fn in (es_step, plain, es_step, plain):  # warm-up
            fn()
        times = {"es": [], "plain": []}
        for _ in range(args.rounds):
            for key, fn in (("es", es_step), ("plain", plain)):
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                times[key].append(time.perf_counter() - t0)
        es, base = statistics.median(times["es"]), statistics.median(times["plain"])
        print(f"| {name} | {rows} | {es * 1e3:.1f} | {base * 1e3:.1f} | {es / base:.2f}x |")


if __name__ == "__main__":
    main()
