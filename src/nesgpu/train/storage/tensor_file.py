"""safetensors files written and read one tensor at a time: a checkpoint of a model costs no second copy of it in
memory (``safetensors.torch.save`` builds the whole file as one bytes object first; ``load_file`` reads every tensor
before the model takes any).

The format is safetensors' own (8 bytes of little-endian header length, a JSON header of each tensor's dtype,
shape and byte range, then the tensors' bytes), so ``safetensors`` reads what this writes, and reading goes through
``safetensors.safe_open``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import torch

NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
         torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.complex64: "C64",
         **{getattr(torch, name): code for name, code in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"))
            if hasattr(torch, name)}}
"""safetensors' name of each dtype it stores."""

DTYPES = {name: dtype for dtype, name in NAMES.items()}

LOAD_BYTES = 1 << 28
"""Bytes of tensors read before the model takes them (256 MiB): a load's workspace, beyond the largest tensor."""


def write_tensors(f, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """``tensors`` (each contiguous, any device) into the open binary file ``f`` as safetensors, one at a time."""
    header, offset = {}, 0
    for name, t in tensors.items():
        if t.dtype not in NAMES:
            raise TypeError(f"tensor {name!r}: safetensors stores no {t.dtype}")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for t in tensors.values():
        if t.numel():
            data = t.detach().reshape(-1).to("cpu")  # a device tensor: one copy of this tensor only
            f.write(memoryview(data.view(torch.uint8).numpy()))


def described(f, name: str) -> tuple[torch.dtype | None, tuple[int, ...]]:
    """The dtype (None: one torch has no name for here) and shape of tensor ``name`` of an open ``safe_open``
    file, without reading its data."""
    part = f.get_slice(name)
    return DTYPES.get(part.get_dtype()), tuple(part.get_shape())


def batches(f, names: list[str], sources: dict[str, str]) -> Iterator[dict[str, torch.Tensor]]:
    """The tensors of ``names`` (each read from ``sources[name]``) of an open ``safe_open`` file, in batches of
    about :data:`LOAD_BYTES`."""
    batch, size = {}, 0
    for name in names:
        batch[name] = f.get_tensor(sources[name])
        size += batch[name].numel() * batch[name].element_size()
        if size >= LOAD_BYTES:
            yield batch
            batch, size = {}, 0
    if batch:
        yield batch


__all__ = ["DTYPES", "NAMES", "batches", "described", "write_tensors"]
