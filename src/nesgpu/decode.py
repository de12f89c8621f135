"""A compiled decode for a population's ``generate()``.

transformers' static KV cache gives every decode step the same shapes, so one ``torch.compile`` graph
serves every step (the prefill, whose shapes differ, stays eager: transformers compiles only the decode).
The population's forward compiles like the plain model's: the perturbed layers' Python (row checks, noise
lookups) runs once at tracing, their small per-layer operations fuse, and a new step's noise or sigma are
new tensor values, not new code: they do not recompile. A new batch shape (rows, or prompt length) does,
so a generation task pads its prompts to one length.

:class:`CompiledDecode` holds the options to pass to ``generate()`` and counts the graphs the compiler
builds, so that a caller can see (and bound) recompiles.

    >>> decode = CompiledDecode(torch.device("cpu"))
    >>> with pm.perturbing():
    ...     out = pm.model.generate(input_ids=rows, attention_mask=mask, **decode.options)
    >>> decode.graphs  # graphs compiled so far
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import FunctionalPerturbed

MODES = ("default", "reduce-overhead", "max-autotune")


class CompiledDecode:
    """``generate()`` options for a compiled static-cache decode, and a count of the graphs compiled.

    Args:
        device: the model's device. On CUDA the default mode is ``"reduce-overhead"`` (CUDA graphs, as
            transformers does); elsewhere ``"default"``.
        mode: torch.compile's mode (one of :data:`MODES`), or None for the device's default.

    Attributes:
        options: keyword arguments for ``generate()``: ``cache_implementation="static"`` and a
            ``compile_config`` whose backend is inductor, counted.
        graphs: how many graphs the compiler has built for this object's calls (the first decode of each
            batch shape builds one or a few: graph breaks split a forward).
    """

    def __init__(self, device: torch.device | str, mode: str | None = None):
        from transformers import CompileConfig

        device = torch.device(device)
        if mode is None:
            mode = "reduce-overhead" if device.type == "cuda" else "default"
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
        self.mode, self._backend = mode, _CountingInductor(mode)
        # the mode is the backend's (torch.compile takes a mode for its own inductor only)
        config = CompileConfig(fullgraph=False, dynamic=False, backend=self._backend, mode=None)
        if device.type != "cuda":
            # transformers compiles the decode on accelerators only unless told otherwise (its flag for this)
            config._compile_all_devices = True
        self.options = {"cache_implementation": "static", "compile_config": config}

    @property
    def graphs(self) -> int:
        return self._backend.graphs

    def __repr__(self) -> str:
        return f"CompiledDecode(mode={self.mode!r}, graphs={self.graphs})"


def check_compilable(model: nn.Module) -> None:
    """Raise ValueError when a population's decode cannot compile to one graph: modules in the exact fallback
    (a PEFT adapter's layers, say) call each member's module on its own rows, which the compiler guards by object
    identity, so every decode step would recompile until torch's limit, then run eagerly."""
    fallback = [name or "model" for name, module in model.named_modules() if isinstance(module, FunctionalPerturbed)]
    if fallback:
        raise ValueError(f"the compiled decode needs every perturbed module batched; {len(fallback)} run through the "
                         f"exact fallback ({', '.join(fallback[:3])}{', ...' if len(fallback) > 3 else ''}) and would "
                         f"recompile at every decode step: use compile=False (--compile auto or off)")


class _CountingInductor:
    """torch.compile's inductor backend in ``mode``, counting the graphs it compiles. transformers deep-copies
    its compile options; the copy is this same object, so the count is the caller's."""

    def __init__(self, mode: str):
        self.mode, self.graphs = mode, 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        return compile_fx(graph, example_inputs, config_patches=torch._inductor.list_mode_options(self.mode))

    def __deepcopy__(self, memo: dict) -> _CountingInductor:
        return self


__all__ = ["MODES", "CompiledDecode", "check_compilable"]
