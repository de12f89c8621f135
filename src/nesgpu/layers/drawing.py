"""Drawing one step's noise for the perturbed parameters of a module (the body of ``set_noise``).

Per-direction tensors are reused from the module's previous step where their shapes match and nothing else
holds them (a view, a caller's reference, the record), so a training loop makes no new allocation and takes
no page faults per step.
"""

from __future__ import annotations

import sys

import torch

from ..kinds import Noise
from ..noise import NoiseSource

# CPython before 3.14 counts every reference in sys.getrefcount; later versions may skip some
_EXACT_REFCOUNTS = sys.version_info < (3, 14)


def _storage_uses(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


_STORAGE_USES_ALONE = _storage_uses(torch.empty(1))


def unshared(t: torch.Tensor) -> bool:
    """Whether only the noise record holds ``t``: no other Python reference (a caller's ``z``, an indexing
    view) and no other tensor on its storage (``.detach()``, ``.data``, numpy): then it may be refilled."""
    # references: the record's dict, the caller's local, this argument, getrefcount's own argument
    return _EXACT_REFCOUNTS and sys.getrefcount(t) <= 4 and _storage_uses(t) == _STORAGE_USES_ALONE


HALF = (torch.float16, torch.bfloat16)


def _like(p: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor with the noise's shape, device and dtype (float32 for a half-precision parameter)."""
    if p.dtype in HALF:
        return torch.empty((), dtype=torch.float32, device=p.device).expand(shape)  # no memory
    return p.view(shape)


def draw_noise(slots, params: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], src: NoiseSource,
               previous: dict[str, Noise] | None, step: int, start: int, stop: int) -> dict[str, Noise]:
    """The noise records of ``slots`` (name, kind, geometry) for directions ``[start, stop)`` of ``step``.

    ``params`` gives each parameter (its device and dtype), ``shapes`` the shape its noise has (the
    parameter's, or the geometry's for a matrix stored transposed). Half-precision parameters get float32
    noise: the update is exact in float32, and the forward casts the noise once to the model's dtype."""
    likes = {slot.name: _like(params[slot.name], shapes[slot.name]) for slot in slots}
    gen = src.shared(step)  # one generator for every slot's shared noise, in slot order
    shared = {slot.name: slot.kind.draw_shared(gen, slot.geometry, likes[slot.name]) for slot in slots}

    def draw(gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
        return {f"{slot.name}/{key}": value for slot in slots
                for key, value in slot.kind.draw_directions(gen, n, slot.geometry, likes[slot.name]).items()}

    allocate = fill = None
    metas = {slot.name: likes[slot.name].to("meta") for slot in slots}  # shapes without memory
    if all(slot.kind.allocate_directions(1, slot.geometry, metas[slot.name]) is not None for slot in slots):
        def allocate(n: int) -> dict[str, torch.Tensor]:
            out = {}
            for slot in slots:
                held = previous is None or slot.name not in previous or sys.getrefcount(previous[slot.name]) > 2
                old = {} if held else previous[slot.name].tensors
                device = params[slot.name].device
                for key, meta in slot.kind.allocate_directions(n, slot.geometry, metas[slot.name]).items():
                    reuse = old.get(key)
                    fits = (reuse is not None and reuse.shape == meta.shape and reuse.dtype == meta.dtype
                            and reuse.device == device and unshared(reuse))
                    out[f"{slot.name}/{key}"] = reuse if fits else torch.empty_like(meta, device=device)
            return out

        def fill(gen: torch.Generator, out: dict[str, torch.Tensor]) -> None:
            for slot in slots:  # in draw's order: the generator is consumed the same way
                prefix = slot.name + "/"
                slot.kind.fill_directions(gen, {k[len(prefix):]: v for k, v in out.items() if k.startswith(prefix)},
                                          slot.geometry)

    per_direction = src.per_direction(step, start, stop, draw, allocate, fill)
    noise = {}
    for slot in slots:
        tensors = dict(shared[slot.name])
        prefix = slot.name + "/"
        tensors.update({k[len(prefix):]: v for k, v in per_direction.items() if k.startswith(prefix)})
        noise[slot.name] = Noise(slot.geometry, shapes[slot.name], tensors, stop - start)
    return noise
