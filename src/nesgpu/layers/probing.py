"""Probing what a module computes: its own forward run on a small copy with weights of our choosing."""

from __future__ import annotations

import copy

import torch
from torch import nn


def probe(module: nn.Module, weight: torch.Tensor, x: torch.Tensor, dtype: torch.dtype | None = None):
    """``module``'s own forward on ``x`` with ``weight`` in place of its own, run on a shallow copy (its
    parameters, buffers and children dicts its own; never a copy of a large table), or None if it fails."""
    dtype = dtype or x.dtype
    probe = copy.copy(module)
    probe._parameters = {"weight": nn.Parameter(weight, requires_grad=False)}
    probe._buffers = {k: None if b is None else b.detach().to("cpu", dtype if b.is_floating_point() else b.dtype)
                      for k, b in module._buffers.items()}
    probe._modules = {}
    probe._forward_hooks, probe._forward_pre_hooks = type(module._forward_hooks)(), type(module._forward_pre_hooks)()
    for key, value in module.__dict__.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():  # e.g. embed_scale as a plain tensor
            probe.__dict__[key] = value.detach().to("cpu", dtype)
    try:
        with torch.no_grad():
            return probe(x)
    except Exception:  # another signature (a gated norm): not this form
        return None
