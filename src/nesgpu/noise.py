"""Seeded, on-device noise streams.

Direction ``d``'s noise is a function of ``(seed, step, layer, d)`` only. Directions are grouped into
fixed blocks of :data:`BLOCK` directions; each block has its own generator seed, derived from
``(seed, step, layer, block)``. A caller that needs directions ``[start, stop)`` draws the blocks that
cover the range and slices them, so the noise of a direction does not depend on how many directions
are evaluated at once (chunking) or by whom (distributed ranks).

Every draw uses an explicit ``torch.Generator`` on the target device; the global RNG is never touched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

BLOCK = 32
"""Directions per generator block. Part of the noise definition: changing it changes every draw."""

SHARED = -1
"""Block index of noise that all directions share (permuted and flip-out kinds)."""

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*keys: int) -> int:
    """Mix integer keys into one 63-bit generator seed (a splitmix64 chain, stable across versions)."""
    h = 0x2545F4914F6CDD1D
    for k in keys:
        h = _splitmix64(h ^ (int(k) & _MASK64))
    return h >> 1


class NoiseSource:
    """Generator factory for one layer: hands out seeded generators for ``(step, block)``.

    Args:
        seed: run seed.
        layer: stable integer key of the layer.
        device: where the generator (and so the noise) lives.
    """

    def __init__(self, seed: int, layer: int, device: torch.device):
        self.seed = int(seed)
        self.layer = int(layer)
        self.generator = torch.Generator(device=device)

    def generator_for(self, step: int, block: int) -> torch.Generator:
        return self.generator.manual_seed(derive_seed(self.seed, step, self.layer, block))

    def shared(self, step: int) -> torch.Generator:
        """Generator for the noise every direction shares at ``step``."""
        return self.generator_for(step, SHARED)

    def per_direction(
        self, step: int, start: int, stop: int, draw: Callable[[torch.Generator, int], dict[str, torch.Tensor]],
        allocate: Callable[[int], dict[str, torch.Tensor]] | None = None,
        fill: Callable[[torch.Generator, dict[str, torch.Tensor]], None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Draw per-direction tensors for directions ``[start, stop)``.

        ``draw(generator, n)`` returns a dict of tensors whose first dimension is ``n`` (one block of
        directions) and must consume the generator the same way every time. Blocks are always drawn
        whole, then sliced, so direction ``d`` gets the same values whatever the range. With ``allocate(n)``
        (empty tensors of n rows) and ``fill(generator, slices)`` (the same values as ``draw``, written in
        place), a block that lies wholly inside the range is drawn straight into its slice of the result.
        """
        if not 0 <= start < stop:
            raise ValueError(f"direction range must satisfy 0 <= start < stop; got [{start}, {stop})")
        first, last = start // BLOCK, (stop - 1) // BLOCK
        out: dict[str, torch.Tensor] = {} if allocate is None else allocate(stop - start)
        for b in range(first, last + 1):
            lo, hi = max(start, b * BLOCK), min(stop, (b + 1) * BLOCK)
            if fill is not None and hi - lo == BLOCK:
                fill(self.generator_for(step, b), {k: v[lo - start : hi - start] for k, v in out.items()})
                continue
            # the part of block b inside [start, stop), copied into place: peak memory is the result
            # plus one block
            for key, value in draw(self.generator_for(step, b), BLOCK).items():
                if key not in out:
                    out[key] = value.new_empty((stop - start, *value.shape[1:]))
                out[key][lo - start : hi - start] = value[lo - b * BLOCK : hi - b * BLOCK]
        return out


def random_subsets(
    n: int, groups: int, k: int, rows: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """``rows`` independent random index sets: in each of ``groups`` groups of ``n // groups`` indices,
    pick ``k`` distinct ones in random order. Returns int64 of shape (rows, groups * k).

    With ``k == n // groups`` each row is a random permutation that stays inside its group.
    """
    size = n // groups
    if k == size and groups == 1 and device.type == "cpu":
        # randperm is several times faster than sorting random keys on the CPU
        return torch.stack([torch.randperm(n, generator=generator, device=device) for _ in range(rows)])
    keys = torch.rand(rows, groups, size, generator=generator, device=device)
    # a uniformly random k-subset: the k largest of IID keys (topk is O(size), a full sort is not)
    idx = keys.argsort(dim=-1) if k == size else keys.topk(k, dim=-1, sorted=False).indices
    offsets = torch.arange(groups, device=device).mul_(size).view(1, groups, 1)
    return (idx + offsets).reshape(rows, groups * k)


def random_signs(rows: int, n: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``rows`` x ``n`` independent +-1 entries."""
    bits = torch.randint(0, 2, (rows, n), generator=generator, device=device, dtype=torch.int8)
    return bits.to(dtype).mul_(2).sub_(1)
