"""transformers' attention modules with a vector of their own beside their projections: attention sinks
(``sinks`` (heads,): GPT-OSS, DeepSeek-V4, MiMo-V2, GraniteSWA, ...), a logit per head that the softmax takes
as one more column. The module keeps its own forward and its projections are converted on their own; its
attention function views ``module.sinks`` as broadcasting over the batch (``sinks.reshape(1, -1, 1, 1)``,
``s_aux.view(1, -1, 1)``), and that view, computed here, holds each population row's member's sinks:
(rows, heads, 1, ...). Any other use of the values sends the module to the exact fallback."""

from __future__ import annotations

import torch
from torch import nn

from ..kinds import Kind
from .form import ConversionOptions, Form
from .guarded_value import GuardedValue, NeedsFallback
from .guarded_forward import GuardedForward
from .swap import swap_class

_VIEWS = frozenset({torch.Tensor.reshape, torch.Tensor.view})


class PerturbedSinks(GuardedForward):
    """An attention module whose own vector ``sinks`` (heads,) takes IID Gaussian noise: every view of it over
    the batch, (1, heads, 1, ...), is each population row's member's (rows, heads, 1, ...) (see the module
    docstring). Shape: the attention's batch is the population's rows, as every attention layer has it."""

    def own_use(self, guard, func, args, kwargs):
        if func in _VIEWS and args and args[0] is guard:
            with torch._C.DisableTorchFunctionSubclass():  # the view's shape, read off a meta tensor
                shape = func(torch.empty(guard.shape, device="meta"), *args[1:], **kwargs).shape
            layout = self.population_layout
            if shape and shape[0] == 1 and layout is not None and layout.certain:
                return self.member_view(guard, shape[1:], layout.rows)
            why = (f" as {tuple(shape)}, not over the batch (1, ...)" if shape[:1] != (1,) else
                   " without the population's rows (call the model through nesgpu.PerturbedModel)" if layout is None
                   else " where the model's input does not say its rows come first (input_ids= or inputs_embeds=)")
        else:
            why = ", where nesgpu computes only a view of it over the batch (sinks.reshape(1, -1, 1, 1))"
        name = getattr(func, "__name__", func)
        raise NeedsFallback(f"{self.label}: its attention uses its {guard.attr!r} by {name}{why}; it runs through the "
                            f"exact fallback: convert(..., fallback=[{self.layer_name!r}])", self.layer_name,
                            f"uses its {guard.attr!r} by {name}")

    def member_view(self, guard: GuardedValue, shape: torch.Size, rows: int) -> torch.Tensor:
        """Each row's member's ``guard.attr`` in ``shape`` per row: (rows, *shape)."""
        with self.own_call():
            pop = self.population_of(rows, guard.dtype, guard.device)
            values = self.member_values(guard.attr, pop, guard.dtype)  # (R, D, heads); (1, 1, heads) if frozen
            return values.expand(pop.repeats, pop.directions, *values.shape[2:]).reshape(rows, *shape)


def is_sink_attention(module: nn.Module) -> bool:
    params = dict(module.named_parameters(recurse=False))
    return "attention" in type(module).__name__.lower() and list(params) == ["sinks"] and params["sinks"].dim() == 1


def _adopt_sinks(module: nn.Module, found, kind: Kind, options: ConversionOptions) -> nn.Module:
    swap_class(module, PerturbedSinks, "Perturbed")
    module.init_perturbation(kind, options.directions, {}, None)
    return module


HF_FORMS = [Form("sinks", is_sink_attention, _adopt_sinks, None)]
