"""IID Gaussian noise: the cost of drawing a step's noise against the floor, one normal_() fill of a tensor
of the same size (issue 10: "no more than 1x one write of the noise tensor").

Model: the MLP 64-256-256-10 of the issue, population 2048 (1024 directions, antithetic). Three ways:
- floor: ``torch.empty(total).normal_()`` of all the noise numbers at once;
- in place: ``pm.set_noise`` (each 32-direction block written straight into its slice of the last step's
  tensors, reused);
- draw + copy: the previous path (each block drawn into a new tensor, then copied into the result).
Rounds interleave the three; the table gives the median seconds and the ratio to the floor.

Run: python benchmarks/iid_noise.py [--rounds 7] [--directions 1024] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import nesgpu
from nesgpu.kinds import Gaussian


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--directions", type=int, default=1024)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
    pm = nesgpu.PerturbedModel(nesgpu.convert(model, "gaussian").to(device), args.directions, sigma=0.1,
                               antithetic=True)
    total = args.directions * sum(p.numel() for p in model.parameters())
    floor_buffer = torch.empty(total, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    step = [0]

    def in_place():
        step[0] += 1
        pm.set_noise(step=step[0])

    allocate = Gaussian.allocate_directions

    def draw_and_copy():
        Gaussian.allocate_directions = lambda self, n, geometry, like: None
        try:
            step[0] += 1
            pm.set_noise(step=step[0])
        finally:
            Gaussian.allocate_directions = allocate

    ways = {"floor: one normal_() of the noise tensor": lambda: floor_buffer.normal_(generator=gen),
            "set_noise, in place": in_place, "set_noise, draw + copy (before)": draw_and_copy}
    for fn in ways.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():  # as in training: the last step's noise is still held when the next is drawn
            times[name].append(timed(fn, device))
    floor = statistics.median(times[next(iter(ways))])
    print(f"IID noise of {args.directions} directions, {total * 4 / 2**20:.0f} MiB, {device}, median of "
          f"{args.rounds} interleaved rounds")
    print("| way | seconds | vs floor |\n|---|---:|---:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.4f} | {median / floor:.2f}x |")


if __name__ == "__main__":
    main()
