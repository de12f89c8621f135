"""The example inputs of a check, the population rows built from them, and the row-by-row comparison."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch


class Inputs(NamedTuple):
    """What the model is called with: positional and keyword arguments, and how many samples they hold."""

    args: tuple
    kwargs: dict
    samples: int

    @classmethod
    def of(cls, example, dtype: torch.dtype = torch.float64) -> Inputs:
        """A tensor, a tuple of arguments or a dict of keyword arguments, floating tensors in ``dtype``."""
        if isinstance(example, torch.Tensor):
            args, kwargs = (example,), {}
        elif isinstance(example, (tuple, list)):
            args, kwargs = tuple(example), {}
        elif isinstance(example, Mapping):
            args, kwargs = (), dict(example)
        else:
            raise TypeError(f"example_inputs must be a tensor, a tuple of arguments or a dict of keyword arguments; "
                            f"got {type(example).__name__}")
        first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.dim() >= 1), None)
        if first is None:
            raise ValueError("example_inputs holds no tensor with samples on its first dimension")
        as64 = (lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
        return cls(tuple(map(as64, args)), {k: as64(v) for k, v in kwargs.items()}, first.shape[0])

    def member_rows(self, pm) -> Inputs:
        """The population's inputs: every per-sample tensor laid out as ``pm.member_rows`` (sign, sample,
        direction); other arguments as they are."""
        def rows(t):
            per_sample = isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == self.samples
            return pm.member_rows(t) if per_sample else t
        return Inputs(tuple(map(rows, self.args)), {k: rows(v) for k, v in self.kwargs.items()},
                      2 * self.samples * pm.local_directions)


def member_index(sign: int, direction: int, samples: int, directions: int) -> torch.Tensor:
    """The population rows of member (sign, direction), one per sample: row (sign * B + b) * D + d."""
    return (sign * samples + torch.arange(samples)) * directions + direction


def first_tensor(output) -> torch.Tensor | None:
    """The first tensor of a module's output (a tensor, a tuple, or a dict-like ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, Mapping) else output if isinstance(output, (tuple, list)) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def compare_rows(population: torch.Tensor, own: torch.Tensor, index: torch.Tensor, rows: int) -> float | None:
    """The relative difference between a member's own output and its rows of the population's output (its
    rows first, or its tokens flattened), or None where the two cannot be lined up."""
    n = population.shape[0] if population.dim() else 0
    if n == rows:
        mine = population[index]
    elif n and n % rows == 0 and own.dim() and own.shape[0] == n // rows * len(index):
        mine = population.view(rows, n // rows, *population.shape[1:])[index].flatten(0, 1)
    else:
        return None
    if mine.shape != own.shape:
        return None
    if not own.is_floating_point():
        return 0.0 if torch.equal(mine, own) else 1.0
    mine, own = mine.double(), own.double()
    both_nan = mine.isnan() & own.isnan()  # NaN where the member's own model has NaN too (a row all masked)
    if (mine.isnan() ^ own.isnan()).any():
        return float("inf")
    diff = torch.where(both_nan, 0.0, mine - own).norm()
    scale = torch.where(both_nan, 0.0, own).norm()
    return float(diff / scale) if scale > 0 else float(diff)


def each_member(reference, pm):
    """(sign index, direction) of every member, ``reference`` holding that member's weights theta + s sigma z_d
    meanwhile; its own weights again afterwards."""
    noise = pm.dense_noise()
    base = {name: reference.get_parameter(name).detach().clone() for name in noise}
    try:
        for s, sign in enumerate((1.0, -1.0)):
            for d in range(pm.directions):
                with torch.no_grad():
                    for name, z in noise.items():
                        reference.get_parameter(name).copy_(base[name] + sign * pm.sigma * z[d])
                yield s, d
    finally:
        with torch.no_grad():
            for name, value in base.items():
                reference.get_parameter(name).copy_(value)
