"""convert(): make every trainable parameter of a model perturbable, keeping its weights.

Each module is handled by the first rule that fits: already perturbed; nothing to perturb; the first module
form that detects it, in one ordered list (:func:`nesgpu.layers.form_table.forms`: yours, the torch types,
rebuilt with their weights, then ``transformers``' types, swapped in place), given the conversion's
:class:`nesgpu.layers.ConversionOptions`; any other module with parameters of its own (the exact torch.func
fallback); else its children.
Tied parameters (one tensor used by several modules) are tied again afterwards: one module draws their
noise and takes the update, the others apply the same noise.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from torch import nn
from torch.nn.utils import parametrize

from .kinds import Gaussian, Kind, check_kind_options
from .layers import PerturbedModule, functional_fallback
from .layers.form import ConversionOptions, Form
from .layers.form_table import conversion_options, recognise
from .layers.functional import FunctionalPerturbed
from .layers.lowbit import check_low_bit_options
from .layers.registry import LOW_BIT_SWAPS, PATH_SWAPS
from .layers.swap import swap_class
from .layers.ties import guard_aliases, own_parameters, retie, tied_uses
from .trainable import check_trainable, uncovered_parameters

EVOLVE = ("all", "matrices")
"""What evolves: every trainable parameter, or only the weight matrices (2-D and higher: linear, attention,
convolution and expert weights), with embedding tables, norms and biases frozen (EGGROLL's default)."""


class Converted(NamedTuple):
    """A module and what convert made of it (the original is kept, so that its id is not reused meanwhile)."""

    original: nn.Module
    result: nn.Module


@dataclass
class _Run:
    """One convert call: its options (what every module form's adopt receives), its notes, what it converted."""

    options: ConversionOptions
    notes: list[str] = field(default_factory=list)
    converted: dict[int, Converted] = field(default_factory=dict)  # by id(original)


def convert(model: nn.Module, kind: str | Kind = "lowrank", directions: int | None = None,
            freeze: Iterable[str] = (), bits: int | None = None, noise_on: str = "latent",
            act_bits: int | None = None, evolve: str = "all", fallback: Iterable[str] = (), **options) -> nn.Module:
    """Make every trainable parameter of ``model`` perturbable, keeping its weights.

    Linear, Conv1d/2d/3d, Embedding, MultiheadAttention, LSTM/GRU/RNN become perturbed modules whose
    matrices take ``kind``; LayerNorm, RMSNorm, GroupNorm and BatchNorm perturb their affine parameters
    (BatchNorm keeps members apart); transformer layers take their unfused path in population mode. The
    module types of Hugging Face ``transformers`` (GPT-2's Conv1D, every RMSNorm class, MoE expert banks)
    get batched versions. A module of another type with trainable parameters of its own runs through the
    exact (slow) torch.func fallback, with a warning. Where ``kind`` has no product for a module (e.g.
    "permuted" for an Embedding), that module takes IID Gaussian noise, with a warning. Tied parameters (an
    embedding table that is also the output head) are perturbed once: every use sees the same noise.

    Args:
        model: converted in place (a bare module is returned as a new one).
        kind: a :class:`nesgpu.kinds.Kind` or its name: ``"gaussian"``, ``"sparse"``, ``"permuted"``,
            ``"flipout"``, ``"lowrank"``.
        directions: population size (may be left to :class:`PerturbedModel`).
        freeze: parameter names (``"0.weight"``) or module names (``"embed"``: all its parameters) to keep
            fixed; they get ``requires_grad=False``. Parameters that already have it stay fixed too.
        bits: None (float weights), 1 (binary) or 8 (int8): every Linear and Conv1d/2d/3d becomes a low-bit
            module (:class:`nesgpu.layers.LowBitLinear`, ...) whose forward uses quantised weights with a
            per-output-channel scale, derived from its float weights, which ES updates. Biases and norm
            parameters stay float. A model with another module holding trainable matrices is refused.
        noise_on: with ``bits``: "latent" (each member is the quantisation of its perturbed float weights) or
            "quantized" (the noise is added in float to the shared quantised weights).
        act_bits: with ``bits``: None (float activations) or 8 (int8 inputs and an int8 GEMM; Linear only).
        evolve: ``"all"`` (every trainable parameter) or ``"matrices"`` (only weights of 2 or more
            dimensions outside embeddings; embedding tables, norms and biases are frozen).
        fallback: module names (``"backbone.layers.0.mixer"``) that run through the exact torch.func
            fallback with all their children: a module whose forward reads a child's weight directly, or
            regroups its rows, is exact there (:func:`nesgpu.check` finds such modules).
        **options: the kind's options, e.g. ``rank=2`` or ``in_sparsity=0.1``, and the options of module forms
            of your own that declare them (:class:`nesgpu.layers.Form`'s ``options``).

    Returns:
        the converted model. It holds the same Parameter objects as ``model`` (an optimizer built before
        converting still trains it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    freeze = freeze if isinstance(freeze, str) else tuple(freeze)
    run = _start(model, kind, options, fallback, directions=directions, bits=bits, noise_on=noise_on,
                 act_bits=act_bits, evolve=evolve, freeze=freeze)
    _freeze(model, freeze)
    check_trainable(model)
    if evolve == "matrices":
        _freeze_non_matrices(model)
    ties = tied_uses(model)
    model = _swap(model, "", run)
    _settle(model, ties)
    for note in run.notes:
        warnings.warn(note, stacklevel=2)
    missing = uncovered_parameters(model)
    if missing:  # a safety net: every conversion declares all its trainable parameters
        raise ValueError(f"convert could not perturb trainable parameters {missing}; freeze them with "
                         f"convert(..., freeze=[...])")
    return model


def _start(model: nn.Module, kind: str | Kind, options: dict, fallback: Iterable[str], **settings) -> _Run:
    """A conversion's options, checked (see :func:`nesgpu.layers.form_table.conversion_options`)."""
    run = _Run(conversion_options(kind, options, **settings))
    run.options = dataclasses.replace(run.options, fallback=_fallback_names(model, fallback))
    check_low_bit_options(run.options.bits, run.options.noise_on, run.options.act_bits)
    if run.options.evolve not in EVOLVE:
        raise ValueError(f"evolve must be one of {list(EVOLVE)}; got {run.options.evolve!r}")
    return run


def _swap(module: nn.Module, name: str, run: _Run) -> nn.Module:
    """``module`` with every trainable parameter in a perturbed module (see the module docstring). One module
    object registered under several names (``nn.Sequential(l, act, l)``) becomes one converted object."""
    done = run.converted.get(id(module))
    if done is None:
        done = run.converted[id(module)] = Converted(module, _swap_new(module, name, run))
    return done.result


def _swap_new(module: nn.Module, name: str, run: _Run) -> nn.Module:
    if isinstance(module, PerturbedModule):
        _check_converted(module, name, run)
        return module
    if isinstance(module, nn.TransformerEncoder):  # nested tensors cannot carry population rows
        module.enable_nested_tensor = module.use_nested_tensor = False
    bits = run.options.bits
    frozen_low_bit = bits is not None and type(module) in LOW_BIT_SWAPS  # quantised though it does not evolve
    if not frozen_low_bit and not any(p.requires_grad for p in module.parameters()) and not any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        return module  # nothing to perturb, and no batch statistics to keep apart: it runs as it is
    label = f"{name or 'model'} ({type(module).__name__})"
    if name in run.options.fallback:
        return _fallback(module, name, label, run, "is named in convert(..., fallback=[...])")
    if parametrize.is_parametrized(module):
        return _fallback(module, name, label, run, "has parametrized weights (weight_norm, spectral_norm, ...)")
    _swap_path(module, label)
    own = any(p.requires_grad for p in own_parameters(module).values())
    converted = _adopt(module, name, label, run, own)
    if converted is module and isinstance(module, PerturbedModule) and not module.owns_children:
        converted = None  # a form took its own parameters: children follow
    if converted is not None:
        return converted
    # every slot, even a module registered twice (named_children yields it once)
    for child_name, child in [(n, c) for n, c in module._modules.items() if c is not None]:
        setattr(module, child_name, _swap(child, f"{name}.{child_name}" if name else child_name, run))
    return module


def _check_converted(module: PerturbedModule, name: str, run: _Run) -> None:
    """A module converted already keeps its kind: asking for another one is an error, not a no-op."""
    wanted = run.options.kind if run.options.kind.supports(module.product) else Gaussian()
    kinds = {slot.kind for slot in module.slots if slot.geometry is not None}
    if kinds and kinds != {wanted}:
        raise ValueError(f"{name or 'model'} ({type(module).__name__}) is converted already with kind "
                         f"{', '.join(sorted(map(repr, kinds)))}; convert() does not change a converted module's kind "
                         f"to {run.options.kind!r}: convert the original (plain) model")


def _swap_path(module: nn.Module, label: str) -> None:
    """A transformer layer with a fused fast path takes its plain path in population mode (class swap)."""
    torch_class, path_class = next(((base, cls) for base, cls in PATH_SWAPS.items() if isinstance(module, base)),
                                   (None, None))
    if path_class is None:
        return
    if type(module).forward is not torch_class.forward:
        raise ValueError(f"{label} overrides the forward of {torch_class.__name__}, whose fused path reads every "
                         f"weight at once; expected the torch class or a subclass that keeps its forward")
    swap_class(module, path_class, "Perturbed", exact=torch_class)


def _kind_for(product: str | None, label: str, run: _Run) -> Kind:
    """The model's kind, or IID Gaussian (with a note) where it has no ``product``."""
    if product is None or run.options.kind.supports(product):
        return run.options.kind
    run.notes.append(f"{label}: kind {run.options.kind.name!r} has no {product} product; it takes IID Gaussian noise")
    return Gaussian()


def _adopt(module: nn.Module, name: str, label: str, run: _Run, own: bool) -> nn.Module | None:
    """The first form that detects ``module`` adopts it (a torch type rebuilt, a transformers type or yours
    swapped in place), given the conversion's options; else the exact torch.func fallback where ``module`` has
    trainable parameters of its own (``own``), None where not (its children follow)."""
    found = recognise(module, own)
    if found is None and own and run.options.bits is not None:
        raise ValueError(f"bits={run.options.bits}: {label} would need the torch.func fallback, which has no low-bit "
                         f"version; expected only Linear and Conv1d/2d/3d to hold trainable matrices, or freeze it "
                         f"with convert(..., freeze=[{name!r}])")
    if found is None:
        return _fallback(module, name, label, run, "has no batched perturbed version") if own else None
    form, what = found
    kind = _kind_for(form.product, label, run)
    _check_takes(form, name, label, run.options)
    try:
        return form.adopt(module, what, kind, run.options)
    except ValueError as e:
        params = [f"{name}.{n}" if name else n for n, p in module.named_parameters() if p.requires_grad]
        raise ValueError(f"cannot perturb parameters {params} of {label}: {e}; freeze them with "
                         f"convert(..., freeze=[...])") from e


def _check_takes(form: Form, name: str, label: str, options: ConversionOptions) -> None:
    """A form with a product is refused a low-bit option it does not take (:attr:`Form.takes`), by name."""
    if form.product is None:
        return  # elementwise noise only: its parameters stay float
    if options.bits is not None and "bits" not in form.takes:
        raise ValueError(f"bits={options.bits}: {label} has no low-bit version; expected only Linear and "
                         f"Conv1d/2d/3d to hold trainable matrices, or freeze it with convert(..., freeze=[{name!r}])")
    if options.act_bits is not None and "act_bits" not in form.takes:
        raise ValueError(f"act_bits={options.act_bits}: {label} has no int8-activation version; expected "
                         f"only Linear layers to be low-bit, or freeze it with convert(..., freeze=[{name!r}])")


def _fallback(module: nn.Module, name: str, label: str, run: _Run, why: str) -> nn.Module:
    """``module`` and its children in the exact torch.func fallback (with a note saying why)."""
    if run.options.bits is not None:
        raise ValueError(f"bits={run.options.bits}: {label} {why} and would need the torch.func fallback, which has no "
                         f"low-bit version; expected only Linear and Conv1d/2d/3d to hold trainable matrices, or "
                         f"freeze it with convert(..., freeze=[{name!r}])")
    if any(isinstance(m, (nn.modules.batchnorm._BatchNorm, PerturbedModule)) for m in module.modules()):
        raise ValueError(f"{label} needs the torch.func fallback, but contains a BatchNorm or a perturbed module, "
                         f"which it cannot evaluate member by member; freeze it with convert(..., freeze=[{name!r}])")
    run.notes.append(f"{label} {why}; it runs through the exact torch.func fallback, member by member (slow)")
    return functional_fallback(module, run.options.directions)


def _fallback_names(model: nn.Module, names: Iterable[str]) -> frozenset[str]:
    """convert's ``fallback``: module names of ``model``, with the other names of a module registered under
    several (``nn.Sequential(l, act, l)``: "2" is "0" too, which convert meets first)."""
    if isinstance(names, str):
        raise TypeError(f"fallback must be a list of module names; got the string {names!r}")
    modules = dict(model.named_modules(remove_duplicate=False))
    unknown = [n for n in names if n not in modules]
    if unknown:
        raise ValueError(f"fallback: {unknown[0]!r} names no module of the model; expected a name as "
                         f"model.named_modules() gives it, e.g. {sorted(modules)[1:4]}")
    return frozenset(n for n, m in modules.items() if any(m is modules[given] for given in names))


def _settle(model: nn.Module, ties: list[list[tuple[str, str]]]) -> None:
    """The converted model's ties made again, its aliases guarded, each kind's options checked against it."""
    retie(model, ties)
    guard_aliases(model)
    check_kind_options((f"{n}.{slot.name}" if n else slot.name, slot.kind, slot.geometry)
                       for n, m in model.named_modules() if isinstance(m, PerturbedModule) for slot in m.slots)


# ----- what evolves ----------------------------------------------------------------------------------
def summary(model: nn.Module) -> str:
    """How many parameters of a converted model evolve, which are frozen, tied or in the exact fallback.

    Example:
        >>> print(nesgpu.summary(nesgpu.convert(model, "lowrank", evolve="matrices")))
        evolving 1,048,576 of 1,310,720 parameters (80.0%) in 28 tensors; frozen 262,144 in 21 tensors ...
    """
    params = dict(model.named_parameters())  # tied tensors once
    evolving = {n: p for n, p in params.items() if p.requires_grad}
    total, count = sum(p.numel() for p in params.values()), sum(p.numel() for p in evolving.values())
    lines = [f"evolving {count:,} of {total:,} parameters ({100 * count / max(total, 1):.1f}%) in "
             f"{len(evolving)} tensors; frozen {total - count:,} in {len(params) - len(evolving)} tensors"]
    kinds: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, PerturbedModule):
            for slot in m.slots:
                kinds[slot.kind.name] = kinds.get(slot.kind.name, 0) + m.get_parameter(slot.name).numel()
    lines.append("noise: " + ", ".join(f"{k} {v:,}" for k, v in sorted(kinds.items())))
    ties = [f"{m}.{a}" if m else a for group in tied_uses(model) for m, a in group[1:]]
    fallback = [n for n, m in model.named_modules() if isinstance(m, FunctionalPerturbed)]
    if ties:
        lines.append(f"tied (perturbed once, with the tensor they share): {ties}")
    if fallback:
        lines.append(f"exact fallback, member by member (slow): {fallback}")
    return "\n".join(lines)


def _freeze(model: nn.Module, names: Iterable[str]) -> None:
    if isinstance(names, str):
        raise TypeError(f"freeze must be a list of parameter or module names; got the string {names!r}")
    names = list(names)
    params = dict(model.named_parameters(remove_duplicate=False))  # a module registered twice: either name
    for name in names:
        matched = [p for n, p in params.items() if n == name or n.startswith(name + ".")]
        if not matched:
            raise ValueError(f"freeze: {name!r} names no parameter or module of the model; expected one of "
                             f"{sorted(params)} or their module prefixes")
        for p in matched:
            p.requires_grad_(False)
    if names and not any(p.requires_grad for p in params.values()):
        raise ValueError(f"freeze={names} leaves no trainable parameter; expected at least one to evolve")


def _freeze_non_matrices(model: nn.Module) -> None:
    """evolve="matrices": freeze embedding tables and every parameter of fewer than 2 dimensions."""
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.dim() < 2 or isinstance(module, nn.Embedding):
                p.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("evolve='matrices' leaves no trainable parameter: the model has no weight matrix outside "
                         "its embeddings; expected evolve='all'")
