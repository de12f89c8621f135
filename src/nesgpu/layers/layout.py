"""Which member each row of a perturbed module's input belongs to: the (repeats, directions) layout of the
population rows, and the model's flattened tokens.

The model's input has ``rows`` population rows (R x D), and a module usually sees them first, as
(rows, ..., features). Some models flatten their rows' tokens before a layer, (rows * T, features): decoder
layers that reshape before their MLP, MoE blocks whose shared expert runs on the flattened tokens. Token j
then belongs to row ``j // T``, not to direction ``j % D``, and a row-wise module (its output row i depends
only on its input row i: Linear, Conv1D, Embedding, LayerNorm, RMSNorm) runs such an input as (rows, T, ...).

The rows are certain when they come from a transformers-style ``input_ids`` / ``inputs_embeds`` (always
rows-first): then any first dimension that is not the rows, nor a multiple of them on a 2-D input, is an
error. A model called with a plain tensor may be sequence-first (its first dimension is not the rows); its
flattened tokens are recognised only as (rows * T, features) with T the input's second dimension, and
anything else is left to the module's own checks (a multiple of the directions).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch

from .guarded_value import NeedsFallback, parent_name


class RowLayout(NamedTuple):
    """The model's population input as one call sees it: its rows, the length of its second dimension (None
    for a 1-D input) and whether the rows are certainly first (``input_ids`` / ``inputs_embeds``)."""

    rows: int
    length: int | None
    certain: bool


def flattened_length(layout: RowLayout, x: torch.Tensor) -> int | None:
    """1 when ``x``'s first dimension is the population's rows; T when it holds their tokens flattened, (rows * T,
    ...) on at most 2 dimensions with T the model input's length; None for anything else (a tiling, ``x.repeat(E,
    1)``, or a regrouping: the same count of rows in another order, which nesgpu must not guess)."""
    n = x.shape[0] if x.dim() else 0
    if n == layout.rows:
        return 1
    if x.dim() <= 2 and layout.length is not None and n == layout.rows * layout.length:
        return layout.length
    return None


def _unplaced(label: str, name: str, x: torch.Tensor, layout: RowLayout) -> NeedsFallback:
    return NeedsFallback(f"{label}: its input {tuple(x.shape)} has {x.shape[0] if x.dim() else 0} rows on the first "
                      f"dimension, neither the population's {layout.rows} rows nor their {layout.rows} x "
                      f"{layout.length} tokens flattened to 2-D, so nesgpu cannot tell which member each row belongs "
                      f"to; run the module that reshapes or repeats its input through the exact fallback "
                      f"(convert(..., fallback=[{parent_name(name)!r}])), or freeze it", parent_name(name),
                      f"hands {label} its rows regrouped (input {tuple(x.shape)})")


def tokens_per_row(layout: RowLayout | None, x: torch.Tensor, label: str, name: str) -> int:
    """T when ``x`` (a row-wise module's input) holds the rows' tokens flattened (see :func:`flattened_length`);
    0 when its first dimension is the rows, or 1 (shared by every row), or the layout is unknown. Raises where
    the rows are certain and ``x`` is neither."""
    if layout is None or x.dim() == 0 or x.shape[0] in (1, layout.rows):  # 1: shared by every row (position ids)
        return 0
    tokens = flattened_length(layout, x)
    if tokens is not None:
        return tokens
    if layout.certain:
        raise _unplaced(label, name, x, layout)
    return 0


def member_tokens(layout: RowLayout | None, x: torch.Tensor, label: str, name: str) -> int:
    """For a module that must find each row's member (the exact fallback, MoE routers and expert banks): 1 when
    ``x`` has the population's rows first, T when it holds their tokens flattened; raises otherwise."""
    if layout is None:
        raise ValueError(f"{label}: a population call of this module needs the model's population rows; call the "
                         f"model through nesgpu.PerturbedModel")
    tokens = flattened_length(layout, x)
    if tokens is None:
        raise _unplaced(label, name, x, layout)
    return tokens


def check_rows(layout: RowLayout | None, n: int, label: str, name: str) -> None:
    """A module that is not row-wise (convolutions, recurrent and attention layers, batch norms) takes the
    population's rows first: a flattened or regrouped first dimension is an error where the rows are certain."""
    if layout is not None and layout.certain and n != layout.rows:
        raise NeedsFallback(f"{label}: its input has {n} rows on the first dimension; expected the population's "
                            f"{layout.rows} rows first, as the model's input has them. A parent that regroups its "
                            f"input rows should run through the exact fallback (convert(..., "
                            f"fallback=[{parent_name(name)!r}]))", parent_name(name),
                            f"hands {label} its rows regrouped ({n} rows)")


def rows_view(t: torch.Tensor, repeats: int, directions: int) -> torch.Tensor:
    """(R * D, ..., C) -> (R, D, M, C): every dimension between the rows and the channels is per member."""
    return t.view(repeats, directions, -1, t.shape[-1])


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``x`` returns: the autocast dtype when autocast is on for its device."""
    if x.is_floating_point() and torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


class Cached(NamedTuple):
    """A value computed from ``key``, kept until the key changes."""

    key: tuple
    value: object


def repeat_scale(repeats: int, sigma: float, antithetic: bool, like: torch.Tensor) -> torch.Tensor:
    """sigma * s_r for each repeat r: +sigma, or -sigma for r >= R/2 with antithetic sampling."""
    scale = torch.full((repeats,), float(sigma), dtype=like.dtype, device=like.device)
    if antithetic:
        scale[repeats // 2 :] = -float(sigma)
    return scale


def repeat_signs(repeats: int, antithetic: bool, device: torch.device) -> torch.Tensor:
    """s_r in {+1, -1} for each repeat r."""
    return repeat_scale(repeats, 1.0, antithetic, torch.empty(0, device=device))


def member_weights(weights, directions: int, antithetic: bool, device: torch.device | None,
                   check_finite: bool = True) -> torch.Tensor:
    """The update's weights, (D,) or (R, D) laid out as the rows, checked and reduced to each direction's
    ``w_d = 1/R sum_r s_r w[r, d]`` (D,). ``device``: the model's, named where the weights have no values
    (the meta device). ``check_finite``: a NaN or inf weight is an error naming the first (a host read)."""
    check_weights(weights, directions, antithetic, device, check_finite)
    if weights.dim() == 1:
        return weights
    signs = repeat_scale(weights.shape[0], 1.0, antithetic, weights)  # +-1, exact in the weights' dtype
    return (signs.view(-1, 1) * weights).mean(0)


def check_weights(weights, directions: int, antithetic: bool, device: torch.device | None,
                  check_finite: bool = True) -> None:
    """:func:`member_weights`'s checks without its reduction: a ValueError or TypeError naming what is wrong."""
    shapes = f"({directions},) or (R, {directions})"
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():  # int, bool, complex
        got = weights.dtype if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise TypeError(f"weights must be a floating-point torch.Tensor of shape {shapes}; got {got}")
    if weights.is_meta:
        raise ValueError(f"weights must hold values on the model's device ({device}); got a tensor on the meta "
                         f"device (shapes without data)")
    if weights.shape != (directions,) and (weights.dim() != 2 or weights.shape[1] != directions):
        raise ValueError(f"weights must have shape {shapes}; got {tuple(weights.shape)}")
    if weights.dim() == 2 and antithetic and weights.shape[0] % 2:
        raise ValueError(f"antithetic weights need an even number of repeats; got shape {tuple(weights.shape)}")
    if check_finite and not bool(weights.isfinite().all()):
        index = tuple((~weights.isfinite()).nonzero()[0].tolist())
        where = ", ".join(map(str, index))
        raise ValueError(f"weights must be finite; got {weights[index].item()} at weights[{where}] (a NaN or inf "
                         f"weight makes every perturbed parameter's .grad non-finite)")


class PopulationCall(NamedTuple):
    """One population call: R repeats of D directions, each repeat's signed sigma (R,), and each sign's
    (S,): S is 2 with antithetic sampling (repeat r has sign r // (R / 2)), else 1."""

    repeats: int
    directions: int
    scale: torch.Tensor
    signed: torch.Tensor


@contextmanager
def one_sequence_per_row(model):
    """Within the block, ``model.generate`` refuses options that expand the rows (``num_beams`` or
    ``num_return_sequences`` above 1): transformers repeats each row k times, so a beam would take another
    member's noise."""
    generate = getattr(type(model), "generate", None)
    if generate is None or "generate" in model.__dict__:
        yield
        return

    def guarded(*args, **kwargs):
        config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
        for key in ("num_beams", "num_return_sequences"):
            value = kwargs.get(key, getattr(config, key, 1))
            if value not in (None, 1):
                raise ValueError(f"generate({key}={value}) in a population call: transformers repeats each row "
                                 f"{value} times, so the copies would take other members' noise; expected num_beams=1 "
                                 f"and num_return_sequences=1: give every member its prompts with pm.member_rows "
                                 f"(several answers to one prompt: repeat the prompt in the batch)")
        return generate(model, *args, **kwargs)

    model.__dict__["generate"] = guarded  # an instance attribute, found before the class's method
    try:
        yield
    finally:
        model.__dict__.pop("generate", None)



def tell_layout(layers, directions: int, antithetic: bool, args: tuple, kwargs: dict) -> None:
    """Tell every perturbed module of ``layers`` how a model call's input lays out the population rows of
    ``directions`` directions (input_ids, inputs_embeds or the first tensor): a module that sees the tokens
    flattened (rows * T, ...), as an MoE block's experts do, needs it to find each token's member."""
    named = next((t for t in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"))
                  if isinstance(t, torch.Tensor) and t.dim() >= 1), None)
    rows = named if named is not None else next(
        (t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.dim() >= 1), None)
    layout = None
    if rows is not None and rows.shape[0] % directions == 0 and not (antithetic and (rows.shape[0] // directions) % 2):
        # else not laid out rows-first (a sequence-first model): the modules check what they can
        layout = RowLayout(rows.shape[0], rows.shape[1] if rows.dim() > 1 else None, named is not None)
    for layer in layers:
        layer.__dict__["population_layout"] = layout  # a plain attribute, without nn.Module.__setattr__
