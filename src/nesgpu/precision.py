"""Reduced-precision population forwards: whether the hardware runs them natively.

Autocast to bf16/fp16 pays off only where the matrix units take that dtype: on an x86 CPU, AVX512-BF16
or AMX for bf16 and AVX512-FP16 or AMX-FP16 for fp16 (elsewhere oneDNN converts to fp32 around every GEMM
and the forward is slower than in fp32, see BENCHMARKS.md); on a GPU, tensor cores for that dtype. The
trainer says so once per run when they are missing.
"""

from __future__ import annotations

import torch

# the dtypes a model's weights may be held in (below float32, ES keeps float32 master weights)
DTYPES = ("float32", "bfloat16", "float16")
# the precisions of a population forward (or a backprop step) and the autocast dtype of each
PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of ``precision`` ("fp32": None, no autocast); a ValueError names the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}; got {precision!r}")
    return None if PRECISIONS[precision] is None else getattr(torch, PRECISIONS[precision])


# CPU feature flags (torch.cpu.get_capabilities) that give native GEMMs in each dtype
_CPU_FEATURES = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}
# the first CUDA compute capability with tensor cores for each dtype (fp16: Volta; bf16: Ampere)
_CUDA_CAPABILITY = {torch.bfloat16: (8, 0), torch.float16: (7, 0)}


def native_support(device: torch.device, dtype: torch.dtype) -> bool | None:
    """Whether ``device`` has GEMM units for ``dtype``; None when torch cannot tell."""
    if dtype not in _CPU_FEATURES:
        return None
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= _CUDA_CAPABILITY[dtype]
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)  # not in every torch version
    if device.type != "cpu" or get_capabilities is None:
        return None
    capabilities = get_capabilities()
    if capabilities.get("architecture") != "x86_64":  # the flags below are x86 ones (ARM reports others)
        return None
    return any(capabilities.get(flag, False) for flag in _CPU_FEATURES[dtype])


def slow_precision_note(device: torch.device, dtype: torch.dtype) -> str | None:
    """A one-line warning when ``dtype`` will run emulated (slower than fp32) on ``device``, else None."""
    if native_support(device, dtype) is not False:
        return None
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    if device.type == "cuda":
        units = f"{name} tensor cores (compute capability {'.'.join(map(str, _CUDA_CAPABILITY[dtype]))}+)"
    else:
        units = " / ".join(_CPU_FEATURES[dtype]) + " units"
    return (f"note: this {device.type.upper()} has no {units}, so {name} matrix products are emulated and the "
            f"forward will be slower than fp32; --precision {name} still halves activation memory")
