"""``nesgpu.check``: prove, on a user's own model and inputs, that every population row is its member's model.

The model is copied twice in float64: one copy is converted and evaluates the population (antithetic pairs
of ``directions``), the other stays plain and, for every member (s, d), takes the weights
``theta + s sigma z_d`` and runs the example inputs. Forward hooks compare every module's output, row by row,
so a difference is reported where it starts, not only at the logits. With ``max_new_tokens``, the greedy
``generate()`` of the population is compared with each member's own too.
"""

from __future__ import annotations

import copy
import math
import numbers
import warnings
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..conversion import convert
from ..layers import FunctionalPerturbed, PerturbedModule
from ..model import PerturbedModel, check_sigma
from .generation import compare_generate
from .report import CheckReport, ModuleError
from .rows import Inputs, compare_rows, each_member, first_tensor, member_index

MAX_NEW_TOKENS = 1 << 20
FLOAT32_TOLERANCE = 1e-5
"""The tolerance where a module computes in float32 (an MoE router, a norm) even in the float64 copy: its
rounding is float32's; a silent layout or perturbation bug is orders of magnitude larger (0.01-1)."""


def check(model: nn.Module, example_inputs, directions: int = 4, kind: str = "lowrank", sigma: float = 0.05,
          seed: int = 0, tolerance: float = 1e-9, max_new_tokens: int = 0, dtype: torch.dtype = torch.float64,
          compile: bool = False, **convert_options) -> CheckReport:
    """Whether the population of ``model`` is exact on ``example_inputs``: every population row equals the
    output of its member's own model, in float64, module by module.

    Args:
        model: a plain model (converted here, on a copy) or one converted already; it is not changed.
        example_inputs: what the model is called with: a tensor, a tuple of arguments, or a dict of keyword
            arguments (``{"input_ids": ..., "attention_mask": ...}``); tensors have the samples first.
        directions: directions D; the check evaluates 2 D members (antithetic pairs).
        kind, **convert_options: as :func:`nesgpu.convert` (``fallback=[...]``, ``freeze=[...]``, ``rank=...``).
        sigma: the noise scale (large enough for every parameter's noise to show in the outputs).
        tolerance: the largest relative difference counted as exact, finite and >= 0 (float64 rounds at ~1e-15);
            where a module computes in float32 by design, at least ``FLOAT32_TOLERANCE``; the report says which.
        max_new_tokens: also compare ``generate()`` over this many new tokens (0: none; models with ``generate``):
            greedy (the same tokens as every member's own) and sampled (each sampled row's logits equal its member's
            own along the same tokens, so it samples from its member's distribution).
        dtype: the precision of the check: float64, or float32 for a model that does not run in float64 (the
            tolerance is then at least ``FLOAT32_TOLERANCE``).
        compile: with ``max_new_tokens``, the population's generate() runs the compiled decode (CompiledDecode).

    Returns:
        a :class:`CheckReport`: ``exact``, the worst relative error of every module, which modules take the exact
        fallback and why, or why the model is refused (NaN or infinite weights are). ``print(report)``: a table.

    Example:
        >>> report = nesgpu.check(model, {"input_ids": ids, "attention_mask": mask})
        >>> print(report); assert report.exact
    """
    _check_arguments(directions, sigma, tolerance, dtype, max_new_tokens)
    inputs = _inputs(example_inputs, dtype)
    reference = _copy(model, dtype)  # the plain model first: its weights, then its run on the inputs
    low_precision_ops = _non_finite(reference) or _low_precision_ops(reference, inputs, dtype)
    if isinstance(low_precision_ops, str):
        return CheckReport.refusal(low_precision_ops, tolerance)
    notes: list[str] = []
    pm = _population_of(_copy(model, dtype), kind, directions, sigma, seed, notes, convert_options)
    if isinstance(pm, str):
        return CheckReport.refusal(f"convert: {pm}", tolerance)
    net = pm.model
    rows = inputs.member_rows(pm)
    unused: list[str] = []
    try:
        with _noted(notes):
            pm.population_call(*rows.args, unused=unused, **rows.kwargs)  # a module needing the fallback goes there
        skip = _inner_modules(net)
        with _recording(net, skip, population=True) as population:
            pm.population_call(*rows.args, unused=unused, **rows.kwargs)
    except Exception as e:  # noqa: BLE001 - ours are ValueError/RuntimeError; the model's own code may raise any
        why = e if isinstance(e, (ValueError, RuntimeError)) else f"{type(e).__name__}: {e}"
        return CheckReport.refusal(f"population call: {why}", tolerance, _fallback_modules(net, notes))
    fallback = _fallback_modules(net, notes)
    errors, low_outputs = _compare_members(reference, pm, inputs, population, skip)
    low_precision = low_precision_ops or {f"{name or 'the model'}: its output" for name in low_outputs}  # else none
    tolerance = max(tolerance, FLOAT32_TOLERANCE) if low_precision or dtype != torch.float64 else tolerance
    generate = compare_generate(reference, pm, inputs, rows, max_new_tokens, unused, tolerance, compile) if (
        max_new_tokens) else None
    return CheckReport.of(errors, list(population), tolerance, fallback, _fallback_share(net), generate,
                          sorted(low_precision), unused)


def _population_of(net: nn.Module, kind: str, directions: int, sigma: float, seed: int, notes: list[str],
                   convert_options: dict) -> PerturbedModel | str:
    """``net`` converted (unless it is already) as a population with its noise drawn; or why convert refused."""
    try:
        if not any(isinstance(m, PerturbedModule) for m in net.modules()):
            with _noted(notes):
                net = convert(net, kind, **convert_options)
        pm = PerturbedModel(net, directions, sigma=sigma, antithetic=True, seed=seed)
    except (ValueError, TypeError, RuntimeError) as e:
        return str(e)
    pm.set_noise(step=1)
    return pm


def _inputs(example_inputs, dtype: torch.dtype) -> Inputs:
    """The example inputs, refused when they hold no sample (no member would run: a report would prove nothing)."""
    inputs = Inputs.of(example_inputs, dtype)
    if inputs.samples == 0:
        raise ValueError("example_inputs holds 0 samples (its tensors' first dimension); expected a batch of at least "
                         "one sample")
    return inputs


def _check_arguments(directions, sigma, tolerance, dtype, max_new_tokens) -> None:
    if isinstance(directions, bool) or not isinstance(directions, int) or directions < 1:
        raise ValueError(f"directions must be a positive int; got {directions!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"max_new_tokens must be a whole number >= 0 (0: the forward pass only); got "
                        f"{type(max_new_tokens).__name__} {max_new_tokens!r:.40}")
    if not 0 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must be a whole number from 0 (the forward pass only) to {MAX_NEW_TOKENS}; "
                         f"got {max_new_tokens}")
    check_sigma(sigma)
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise TypeError(f"tolerance must be a finite number >= 0; got {type(tolerance).__name__} {tolerance!r}")
    if not math.isfinite(tolerance) or tolerance < 0:  # NaN compares false: every model would be DIFFERENT
        raise ValueError(f"tolerance must be a finite number >= 0; got {tolerance!r}")
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"dtype must be torch.float64 or torch.float32; got {dtype}")


@contextmanager
def _noted(notes: list[str]):
    """Collect the warnings of the block (convert's notes, the fallbacks a population call takes) into
    ``notes``, also when the block raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            notes += [str(w.message) for w in caught]


def _non_finite(model: nn.Module) -> str | None:
    """Why a model whose parameters or buffers (in the check's precision) hold NaN or infinity is refused;
    None when every value is finite. NaN rows compare as no difference, so such a model would pass."""
    tensors = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]
               if (t.is_floating_point() or t.is_complex()) and t.device.type != "meta"]  # meta: no values to read
    bad = [n for n, t in tensors if not bool(torch.isfinite(t).all())]
    if not bad:
        return None
    more = f" ... ({len(bad)} tensors)" if len(bad) > 4 else ""
    return (f"the model holds NaN or infinity in {bad[:4]}{more}: "
            f"nothing computed with them can be compared (training refuses such a model too); the model (or the "
            f"checkpoint it was loaded from) is damaged")


def _copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    model = copy.deepcopy(model).to(dtype).eval()
    if hasattr(model, "set_experts_implementation"):  # transformers' grouped_mm MoE kernels refuse float64
        try:
            model.set_experts_implementation("eager")
        except (ValueError, TypeError, AttributeError):
            pass
    return model


# torch's (aten) names of operations, in the words of a model's code
_OP_WORDS = {"_to_copy": "a cast (.float() / .to())", "_softmax": "softmax", "_log_softmax": "log_softmax",
             "addmm": "matmul", "mm": "matmul", "bmm": "matmul", "baddbmm": "matmul", "copy_": "a copy into a tensor"}


class _LowPrecisionOps(TorchDispatchMode):
    """Collects the operations that produce float32 or half tensors (a model that computes parts in float32
    on purpose: an MoE router, a norm, a softmax), down to torch's own (aten) operations, by the innermost
    module of the model running them (``where``: the stack of running modules, kept by hooks)."""

    def __init__(self, lower: tuple[torch.dtype, ...], where: list[tuple[str, str]]):
        super().__init__()
        self.found: dict[tuple[str, str], tuple[dict[str, None], set[str]]] = {}  # module: (ops, dtypes)
        self.lower, self.where = lower, where

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        dtypes = {t.dtype for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.dtype in self.lower}
        if dtypes:
            ops, kinds = self.found.setdefault(self.where[-1], ({}, set()))
            name = str(func.overloadpacket.__name__)
            ops[_OP_WORDS.get(name, name.strip("_"))] = None
            kinds.update(str(d).removeprefix("torch.") for d in dtypes)
        return out


@contextmanager
def _running_modules(model: nn.Module):
    """A stack of (name, type) of the modules of ``model`` running now, the model itself at the bottom."""
    where = [("", type(model).__name__)]

    def enter(name):
        def push(module, args) -> None:
            where.append((name, type(module).__name__))
        return push

    def leave(module, args, output) -> None:  # returns None: the output stays the module's
        where.pop()

    handles = [h for n, m in model.named_modules() if n for h in (
        m.register_forward_pre_hook(enter(n)), m.register_forward_hook(leave))]
    try:
        yield where
    finally:
        for h in handles:
            h.remove()


def _low_precision_ops(reference: nn.Module, inputs: Inputs, dtype: torch.dtype) -> set[str] | str:
    """The parts of the reference model whose own code computes in a lower precision than ``dtype``, each as
    "module (Type): its operations in float32"; or, where the plain model itself fails on the inputs (not
    nesgpu's to judge), why."""
    lower = (torch.float16, torch.bfloat16) + ((torch.float32,) if dtype == torch.float64 else ())
    try:
        with torch.no_grad(), _running_modules(reference) as where, _LowPrecisionOps(lower, where) as mode:
            reference(*inputs.args, **inputs.kwargs)
    except Exception as e:  # noqa: BLE001 - whatever the user's model raises
        return (f"the model itself fails in {str(dtype).removeprefix('torch.')} on these inputs ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); check(..., dtype=torch.float32) checks it in float32")
    alike: dict[tuple[str, str, str], list[str]] = {}  # modules of one type doing the same: named once
    for (name, kind), (ops, dtypes) in mode.found.items():
        done = ", ".join(list(ops)[:6]) + (" ..." if len(ops) > 6 else "")
        alike.setdefault((kind, done, " and ".join(sorted(dtypes))), []).append(name or "the model")
    return {f"{names[0]} ({kind}{f', and {len(names) - 1} more like it' if len(names) > 1 else ''}): {done} in "
            f"{dtypes}" for (kind, done, dtypes), names in alike.items()}


def _inner_modules(net: nn.Module) -> set[str]:
    """Names of the modules inside a perturbed module (an MoE bank's activation, the fallback's children):
    the perturbed module computes them its own way (all members' tokens at once, or under vmap), so only its
    own output is compared."""
    return {f"{name}.{child}" if name else child for name, m in net.named_modules() if isinstance(m, PerturbedModule)
            for child, _ in m.named_modules() if child}


@contextmanager
def _recording(model: nn.Module, skip: set[str], population: bool = False):
    """Record the first tensor of every module's output (but those in ``skip``), call by call:
    {name: [tensor, ...]}, in the order the modules first finish (children before their parents). In a
    ``population`` call, the exact fallback's inner calls (member by member, under vmap) are not recorded."""
    outputs: dict[str, list[torch.Tensor]] = {}

    def hook(name):
        def record(module, args, output):
            t = first_tensor(output)
            inner = population and isinstance(module, PerturbedModule) and not module.is_perturbing
            if t is not None and not inner:
                outputs.setdefault(name, []).append(t.detach().clone())
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n not in skip]
    try:
        yield outputs
    finally:
        for h in handles:
            h.remove()


def _compare_members(reference: nn.Module, pm: PerturbedModel, inputs: Inputs,
                     population: dict[str, list[torch.Tensor]], skip: set[str]) -> tuple[dict[str, ModuleError], set]:
    """Each module's worst relative difference between the population rows and the members' own outputs,
    and the modules whose own output is in a lower precision than float64 (they compute in float32)."""
    types = {n: type(m).__name__ for n, m in pm.model.named_modules()}
    errors: dict[str, ModuleError] = {}
    low_precision = set()
    for s, d in each_member(reference, pm):
        index = member_index(s, d, inputs.samples, pm.directions)
        with torch.no_grad(), _recording(reference, skip) as own:
            reference(*inputs.args, **inputs.kwargs)
        for name, calls in own.items():
            pop = population.get(name, [])
            if len(pop) != len(calls):  # called another number of times: its calls do not line up
                continue
            for mine, theirs in zip(pop, calls):
                err = compare_rows(mine, theirs, index, 2 * inputs.samples * pm.directions)
                if err is not None:
                    old = errors.get(name)
                    errors[name] = ModuleError(name, types.get(name, "?"), max(err, old.error if old else 0.0))
                    if theirs.dtype in (torch.float32, torch.float16, torch.bfloat16):
                        low_precision.add(name)
    return errors, low_precision


def _fallback_modules(net: nn.Module, notes: list[str]) -> dict[str, str]:
    """The modules in the exact fallback, each with convert's note on why."""
    found = {}
    for name, m in net.named_modules():
        if isinstance(m, FunctionalPerturbed):
            label = f"{name or 'model'} ("
            note = next((n for n in notes if n.startswith(label)), "")
            found[name] = note[len(label):].split(")", 1)[-1].split("; it runs through the exact")[0].strip() or (
                "the exact fallback")
    return found


def _fallback_share(net: nn.Module) -> float:
    """The share of the trainable parameters that the exact fallback perturbs."""
    params = {id(p): p for p in net.parameters() if p.requires_grad}
    inside = {id(p) for m in net.modules() if isinstance(m, FunctionalPerturbed)
              for p in m.perturbed_parameters().values()}
    total = sum(p.numel() for p in params.values())
    return sum(params[i].numel() for i in inside if i in params) / max(total, 1)
