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
import warnings
from contextlib import contextmanager

import torch
from torch import nn

from ..conversion import convert
from ..layers import FunctionalPerturbed, PerturbedModule
from ..model import PerturbedModel
from .report import CheckReport, ModuleError
from .rows import Inputs, compare_rows, first_tensor, member_index


def check(model: nn.Module, example_inputs, directions: int = 4, kind: str = "lowrank", sigma: float = 0.05,
          seed: int = 0, tolerance: float = 1e-9, max_new_tokens: int = 0, **convert_options) -> CheckReport:
    """Whether the population of ``model`` is exact on ``example_inputs``: every population row equals the
    output of its member's own model, in float64, module by module.

    Args:
        model: a plain model (converted here, on a copy) or one converted already; it is not changed.
        example_inputs: what the model is called with: a tensor, a tuple of arguments, or a dict of keyword
            arguments (``{"input_ids": ..., "attention_mask": ...}``); tensors have the samples first.
        directions: directions D; the check evaluates 2 D members (antithetic pairs).
        kind, **convert_options: as :func:`nesgpu.convert` (``fallback=[...]``, ``freeze=[...]``, ``rank=...``).
        sigma: the noise scale (large enough for every parameter's noise to show in the outputs).
        tolerance: the largest relative difference that counts as exact (float64 rounding is ~1e-15).
        max_new_tokens: also compare greedy ``generate()`` over this many new tokens (models with ``generate``).

    Returns:
        a :class:`CheckReport`: ``exact``, the worst relative error of every module, which modules take the
        exact fallback and why, or why the model is refused. ``print(report)`` shows it as a table.

    Example:
        >>> report = nesgpu.check(model, {"input_ids": ids, "attention_mask": mask})
        >>> print(report); assert report.exact
    """
    if isinstance(directions, bool) or not isinstance(directions, int) or directions < 1:
        raise ValueError(f"directions must be a positive int; got {directions!r}")
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0 < sigma < math.inf:
        raise ValueError(f"sigma must be a positive finite number; got {sigma!r}")
    inputs = Inputs.of(example_inputs)
    reference = _float64_copy(model)
    net, notes = _float64_copy(model), []
    try:
        if not any(isinstance(m, PerturbedModule) for m in net.modules()):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                net = convert(net, kind, **convert_options)
            notes = [str(w.message) for w in caught]
        pm = PerturbedModel(net, directions, sigma=sigma, antithetic=True, seed=seed)
    except (ValueError, TypeError, RuntimeError) as e:
        return CheckReport.refusal(f"convert: {e}", tolerance)
    fallback = _fallback_modules(net, notes)
    pm.set_noise(step=1)
    rows = inputs.member_rows(pm)
    try:
        with _recording(net, population=True) as population:
            pm(*rows.args, **rows.kwargs)
    except (ValueError, RuntimeError) as e:
        return CheckReport.refusal(f"population call: {e}", tolerance, fallback)
    errors = _compare_members(reference, pm, inputs, population)
    generate = _compare_generate(reference, pm, inputs, rows, max_new_tokens) if max_new_tokens else None
    return CheckReport.of(errors, list(population), tolerance, fallback, _fallback_share(net), generate)


def _float64_copy(model: nn.Module) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    return copy.deepcopy(model).to(torch.float64).eval()


@contextmanager
def _recording(model: nn.Module, population: bool = False, on_output=None):
    """Record the first tensor of every module's output, call by call: {name: [tensor, ...]} (or hand each
    to ``on_output(name, call, tensor)``). In a ``population`` call, the calls inside the exact fallback (under
    vmap, member by member) are not recorded."""
    outputs: dict[str, list[torch.Tensor]] = {}
    skipped = {id(c) for m in model.modules() if population and isinstance(m, FunctionalPerturbed)
               for c in m.modules() if c is not m}

    def hook(name):
        def record(module, args, output):
            t = first_tensor(output)
            if t is None or (population and isinstance(module, PerturbedModule) and not module.is_perturbing):
                return  # a fallback's inner (per-member) call
            calls = outputs.setdefault(name, [])
            if on_output is None:
                calls.append(t.detach().clone())
            else:
                on_output(name, len(calls), t)
                calls.append(None)
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if id(m) not in skipped]
    try:
        yield outputs
    finally:
        for h in handles:
            h.remove()


def _set_member(reference: nn.Module, base: dict[str, torch.Tensor], noise: dict[str, torch.Tensor], sign: float,
                d: int, sigma: float) -> None:
    with torch.no_grad():
        for name, z in noise.items():
            reference.get_parameter(name).copy_(base[name] + sign * sigma * z[d])


def _compare_members(reference: nn.Module, pm: PerturbedModel, inputs: Inputs,
                     population: dict[str, list[torch.Tensor]]) -> dict[str, ModuleError]:
    """Each module's worst relative difference between the population rows and the members' own outputs."""
    noise = pm.dense_noise()
    base = {name: reference.get_parameter(name).detach().clone() for name in noise}
    types = {n: type(m).__name__ for n, m in pm.model.named_modules()}
    errors: dict[str, ModuleError] = {}
    for s, sign in enumerate((1.0, -1.0)):
        for d in range(pm.directions):
            index = member_index(s, d, inputs.samples, pm.directions)

            def compare(name, call, own):
                pop = population.get(name, [])
                if call < len(pop):
                    err = compare_rows(pop[call], own, index, 2 * inputs.samples * pm.directions)
                    if err is not None:
                        old = errors.get(name)
                        errors[name] = ModuleError(name, types.get(name, "?"), max(err, old.error if old else 0.0))

            _set_member(reference, base, noise, sign, d, pm.sigma)
            with torch.no_grad(), _recording(reference, on_output=compare):
                reference(*inputs.args, **inputs.kwargs)
    _set_member(reference, base, {n: torch.zeros_like(z) for n, z in noise.items()}, 0.0, 0, 0.0)
    return errors


def _compare_generate(reference, pm: PerturbedModel, inputs: Inputs, rows: Inputs, max_new_tokens: int) -> str:
    """"exact" when every member's greedy generate() equals its population rows', else where they differ."""
    if not hasattr(pm.model, "generate"):
        return "not checked: the model has no generate()"
    options = dict(max_new_tokens=max_new_tokens, do_sample=False)
    pad = getattr(getattr(pm.model, "generation_config", None), "pad_token_id", None)
    if pad is None:
        options["pad_token_id"] = getattr(getattr(pm.model, "config", None), "eos_token_id", 0) or 0
    try:
        with pm.perturbing():
            population = pm.model.generate(*rows.args, **rows.kwargs, **options)
    except (ValueError, RuntimeError) as e:
        return f"fails: {str(e).splitlines()[0]}"
    noise = pm.dense_noise()
    base = {name: reference.get_parameter(name).detach().clone() for name in noise}
    for s, sign in enumerate((1.0, -1.0)):
        for d in range(pm.directions):
            _set_member(reference, base, noise, sign, d, pm.sigma)
            own = reference.generate(*inputs.args, **inputs.kwargs, **options)
            mine = population[member_index(s, d, inputs.samples, pm.directions)]
            if mine.shape != own.shape or not torch.equal(mine, own):
                return f"differs: member (sign {'+-'[s]}, direction {d}) generates {mine.tolist()} instead of {own.tolist()}"
    return f"exact ({max_new_tokens} greedy tokens, {2 * pm.directions} members)"


def _fallback_modules(net: nn.Module, notes: list[str]) -> dict[str, str]:
    """The modules in the exact fallback, each with convert's note on why."""
    found = {}
    for name, m in net.named_modules():
        if isinstance(m, FunctionalPerturbed):
            label = f"{name or 'model'} ("
            note = next((n for n in notes if n.startswith(label)), "")
            found[name] = note[len(label):].split(")", 1)[-1].split(";")[0].strip() or "the exact fallback"
    return found


def _fallback_share(net: nn.Module) -> float:
    """The share of the trainable parameters that the exact fallback perturbs."""
    params = {id(p): p for p in net.parameters() if p.requires_grad}
    inside = {id(p) for m in net.modules() if isinstance(m, FunctionalPerturbed) for p in m.perturbed_parameters().values()}
    total = sum(p.numel() for p in params.values())
    return sum(params[i].numel() for i in inside if i in params) / max(total, 1)
