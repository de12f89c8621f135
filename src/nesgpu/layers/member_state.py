"""A state object (a KV or recurrent cache) handed to the exact fallback, split member by member and merged back.

The fallback runs a module once per population row. A cache holds every row's state in tensors whose first
dimension is the rows (``DynamicCache``'s layers' keys and values, a Mamba layer's conv and SSM states). Row
i's member gets a copy of the object in which each such tensor is its row i (a view: an in-place update writes
through); after every member ran, a tensor a member replaced (``keys = cat([keys, new])``, a layer that was
empty) is the rows' replacements concatenated, and any other attribute a member changed (a length, a flag)
takes the first member's value, which every member shares. Tensors of other shapes, and modules, are shared.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

DEPTH = 4  # a cache's tensors sit a few objects deep (cache -> layers list -> layer -> keys)


def holds_state(value) -> bool:
    """Whether ``value`` is an object holding tensors (a transformers Cache, a state object), not a tensor,
    a plain value or a container of them."""
    if value is None or isinstance(value, (torch.Tensor, int, float, bool, str, torch.dtype, torch.device, tuple,
                                           list, dict, nn.Module)):
        return False
    return type(value).__name__.endswith("Cache") or any(
        isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in v))
        for v in getattr(value, "__dict__", {}).values())


def member_view(value, i: int, rows: int, depth: int = 0):
    """A copy of ``value`` in which every tensor with ``rows`` rows first is its row ``i`` (a one-row view)."""
    if isinstance(value, torch.Tensor):
        return value[i:i + 1] if value.dim() and value.shape[0] == rows else value
    if depth >= DEPTH or isinstance(value, (nn.Module, type)) or callable(value) and not hasattr(value, "__dict__"):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(member_view(v, i, rows, depth + 1) for v in value)
    if isinstance(value, dict):
        return {k: member_view(v, i, rows, depth + 1) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, (int, float, str, bool)):
        view = copy.copy(value)
        view.__dict__ = {k: member_view(v, i, rows, depth + 1) for k, v in vars(value).items()}
        return view
    return value


def merge_members(value, views: list, rows: int, depth: int = 0):
    """``value`` with what the members did to their views (see the module docstring); objects in place."""
    if all(v is value for v in views):
        return value
    if isinstance(value, torch.Tensor) or any(isinstance(v, torch.Tensor) for v in views):
        return _merged_tensor(value, views, rows)
    if depth >= DEPTH or isinstance(value, nn.Module):
        return views[0]
    if isinstance(views[0], (list, tuple)) and all(isinstance(v, type(views[0])) for v in views):
        old = list(value) if isinstance(value, (list, tuple)) else []
        items = [merge_members(old[k] if k < len(old) else None, [v[k] for v in views], rows, depth + 1)
                 for k in range(len(views[0]))]
        if isinstance(value, list):
            value[:] = items
            return value
        return type(views[0])(items)
    if isinstance(views[0], dict):
        old = value if isinstance(value, dict) else {}
        merged = {k: merge_members(old.get(k), [v.get(k) for v in views], rows, depth + 1) for k in views[0]}
        if isinstance(value, dict):
            value.clear()
            value.update(merged)
            return value
        return merged
    if value is not None and hasattr(views[0], "__dict__") and type(views[0]) is type(value):
        for k in vars(views[0]):
            value.__dict__[k] = merge_members(vars(value).get(k), [vars(v).get(k) for v in views], rows, depth + 1)
        return value
    return views[0]


def _merged_tensor(value, views: list, rows: int):
    own_rows = isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == rows
    if own_rows and all(isinstance(v, torch.Tensor) and v.shape == value[i:i + 1].shape
                        and v.data_ptr() == value[i:i + 1].data_ptr() for i, v in enumerate(views)):
        return value  # updated in place, through the views
    if all(isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == 1 for v in views) and (
            own_rows or not isinstance(value, torch.Tensor) or value.numel() == 0 or value.shape[0] != 1):
        return torch.cat(views)  # each row's replacement
    return views[0]  # shared by every row


def attribute_state(module: nn.Module) -> dict[tuple[str, str], object]:
    """What ``module`` and its children hold in their attributes and buffers (not their parameters), by
    (module name, attribute): to tell, after a forward, which it wrote (a recurrent state a module keeps
    between calls, RecurrentGemma's)."""
    found = {}
    for name, m in module.named_modules():
        for key, value in vars(m).items():
            found[(name, key)] = value
        for key, value in m._buffers.items():
            found[(name, key)] = value
    return found


def written_tensors(module: nn.Module, before: dict[tuple[str, str], object]) -> list[str]:
    """The attributes (``name.attr``) of ``module``'s tree that now hold another object holding tensors than
    ``before`` (see :func:`attribute_state`); each is set back to what it held."""
    written = []
    for (name, key), value in attribute_state(module).items():
        old = before.get((name, key))
        if value is not old and any(isinstance(t, torch.Tensor) for t in tree_flatten(value)[0]):
            written.append(f"{name}.{key}" if name else key)
            owner = module.get_submodule(name)
            if key in owner._buffers:
                owner._buffers[key] = old
            else:
                owner.__dict__[key] = old
    return written

