"""What a parent gets when it reads a perturbed parameter directly during a population call.

The parameter holds the unperturbed weights, so a computation with it would ignore every member's noise:
the read returns a :class:`GuardedValue`, whose metadata (``dtype``, ``device``, ``shape``,
``requires_grad``, ``dim()``, ...) reads as the parameter's, and whose every other use asks the module
that owns it (:meth:`nesgpu.layers.PerturbedModule.guarded_use`): an MoE router computes ``F.linear(tokens,
weight)`` per member; any use no module takes is an error naming the parameter, never a silent result.
PEFT's LoRA layers cast their input to ``lora_A.weight.dtype`` and Mamba's blocks to ``norm.weight.dtype``:
such reads pass.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

_T = torch.Tensor
_PROPERTIES = frozenset({_T.dtype, _T.shape, _T.device, _T.ndim, _T.layout, _T.is_cuda, _T.is_meta, _T.is_sparse,
                         _T.is_quantized})
_METHODS = frozenset({_T.dim, _T.size, _T.numel, _T.nelement, _T.element_size, _T.is_floating_point, _T.is_complex,
                      _T.get_device, _T.stride, _T.is_contiguous, _T.__len__, _T.data_ptr})


class NeedsFallback(ValueError, RuntimeError):
    """A population call found a module whose rows nesgpu cannot place, or a parent that computes with a
    perturbed parameter it read: exact only with ``module`` (a module name; "" is the whole model) in the exact
    fallback. :class:`nesgpu.PerturbedModel` puts it there and runs the call again (with a warning);
    ``convert(..., fallback=[module])`` does it up front."""

    def __init__(self, message: str, module: str, reason: str):
        super().__init__(message)
        self.module, self.reason = module, reason  # reason: what the module does, as a short clause


def parent_name(name: str) -> str:
    """The name of the module that holds ``name`` ("" for a child of the model itself)."""
    return name.rpartition(".")[0]


def is_metadata(func) -> bool:
    """Whether ``func`` (as ``__torch_function__`` sees it) reads only a tensor's metadata, not its values."""
    return getattr(func, "__self__", None) in _PROPERTIES or func in _METHODS


class GuardedValue(torch.Tensor):
    """A perturbed parameter as a parent reads it during a population call: its metadata, and only the uses
    its owner computes per member (see the module docstring).

    Attributes: ``param`` (the parameter), ``owner`` (its perturbed module), ``attr`` (its attribute there).
    """

    @staticmethod
    def __new__(cls, param: torch.Tensor, owner, name: str, dtype: torch.dtype | None = None,
                transposed: bool = False):
        data = param.detach() if dtype is None else param.detach().to(dtype)
        view = torch.Tensor._make_subclass(cls, data.t() if transposed else data, False)
        view.param, view.owner, view.attr, view.transposed = param, owner, name, transposed
        return view

    def cast(self, dtype: torch.dtype) -> GuardedValue:
        """The same guarded parameter, read as ``dtype`` (a router's ``weight.float()``)."""
        return GuardedValue(self.param, self.owner, self.attr, dtype, self.transposed)

    def transpose_view(self) -> GuardedValue:
        """The same guarded matrix, transposed (a router's ``tokens @ weight.t()``)."""
        return GuardedValue(self.param, self.owner, self.attr, self.dtype, not self.transposed)

    def __repr__(self) -> str:
        with torch._C.DisableTorchFunctionSubclass():
            return f"GuardedValue({self.owner.layer_name}.{self.attr}, shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = tree_flatten((args, kwargs))[0]
        guard = next(a for a in leaves if isinstance(a, GuardedValue))
        if getattr(func, "__self__", None) is _T.requires_grad:
            return guard.param.requires_grad
        if is_metadata(func):
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        result = guard.owner.guarded_use(guard, func, args, kwargs)
        if result is not NotImplemented:
            return result
        owner = guard.owner.layer_name
        full, parent = (f"{owner}.{guard.attr}", parent_name(owner)) if owner else (guard.attr, "")
        raise NeedsFallback(
            f"parameter {full!r} of {type(guard.owner).__name__} was read directly and used by "
            f"{getattr(func, '__name__', func)} during a population call: it holds the unperturbed weights, so the "
            f"result would ignore every member's noise. Run the module that reads it (its parent {parent or 'model'!r}"
            f"?) through the exact fallback: convert(..., fallback=[{parent!r}]); or call the submodule instead of "
            f"reading its parameter, or freeze the parameter", parent,
            f"computes with its child's parameter {full!r} ({getattr(func, '__name__', func)})")
