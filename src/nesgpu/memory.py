"""How much memory a device has free, and whether an error is an allocator's: what the blocks of directions
are sized by, and what a step retries or reports on."""

from __future__ import annotations

import os
import sys

import torch


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocator's failure: CUDA's (and other accelerators') OutOfMemoryError, the CPU
    allocator's RuntimeError, or Python's MemoryError."""
    text = str(error)
    return (isinstance(error, (torch.OutOfMemoryError, MemoryError)) or type(error).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text and isinstance(error, RuntimeError))


def free_memory(device: torch.device) -> int | None:
    """Bytes the device can still allocate (CPU: MemAvailable of /proc/meminfo), or None where unknown;
    the environment variable NESGPU_FREE_MEMORY (bytes) states it instead."""
    if os.environ.get("NESGPU_FREE_MEMORY"):
        try:
            return int(float(os.environ["NESGPU_FREE_MEMORY"]))
        except ValueError:
            raise ValueError(f"NESGPU_FREE_MEMORY must be a number of bytes; got "
                             f"{os.environ['NESGPU_FREE_MEMORY']!r}") from None
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu" and sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def gib(n: float) -> str:
    """``n`` bytes as GiB, for messages."""
    return f"{n / 2**30:.2f} GiB"


__all__ = ["free_memory", "gib", "out_of_memory"]
