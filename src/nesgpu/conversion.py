"""convert(): make every trainable parameter of a model perturbable, keeping its weights.

Each module is handled by the first rule that fits: already perturbed; nothing to perturb; a torch module
type with a perturbed class (rebuilt, weights copied); a ``transformers`` module type (class swapped in
place); any other module with parameters of its own (the exact torch.func fallback); else its children.
Tied parameters (one tensor used by several modules) are tied again afterwards: one module draws their
noise and takes the update, the others apply the same noise.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.utils import parametrize

from .kinds import Gaussian, Kind, check_kind_options, make_kind
from .layers import PerturbedModule, functional_fallback
from .layers.form_table import recognise
from .layers.functional import FunctionalPerturbed
from .layers.lowbit import check_low_bit_options
from .layers.registry import LOW_BIT_SWAPS, PATH_SWAPS, conversion_for
from .layers.sharing import ALIASES, Alias, AliasHolder
from .layers.swap import swap_class
from .trainable import check_trainable, uncovered_parameters

EVOLVE = ("all", "matrices")
"""What evolves: every trainable parameter, or only the weight matrices (2-D and higher: linear, attention,
convolution and expert weights), with embedding tables, norms and biases frozen (EGGROLL's default)."""


class Converted(NamedTuple):
    """A module and what convert made of it (the original is kept, so that its id is not reused meanwhile)."""

    original: nn.Module
    result: nn.Module


@dataclass
class _Options:
    kind: Kind
    directions: int | None
    bits: int | None
    noise_on: str
    act_bits: int | None
    fallback: frozenset[str] = frozenset()
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
        **options: the kind's options, e.g. ``rank=2`` or ``in_sparsity=0.1``.

    Returns:
        the converted model. It holds the same Parameter objects as ``model`` (an optimizer built before
        converting still trains it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    opts = _Options(make_kind(kind, **options), directions, bits, noise_on, act_bits, _fallback_names(model, fallback))
    check_low_bit_options(opts.bits, opts.noise_on, opts.act_bits)
    if evolve not in EVOLVE:
        raise ValueError(f"evolve must be one of {list(EVOLVE)}; got {evolve!r}")
    _freeze(model, freeze)
    check_trainable(model)
    if evolve == "matrices":
        _freeze_non_matrices(model)
    ties = tied_uses(model)
    model = _swap(model, "", opts)
    _settle(model, ties)
    for note in opts.notes:
        warnings.warn(note, stacklevel=2)
    missing = uncovered_parameters(model)
    if missing:  # a safety net: every conversion declares all its trainable parameters
        raise ValueError(f"convert could not perturb trainable parameters {missing}; freeze them with "
                         f"convert(..., freeze=[...])")
    return model


def _swap(module: nn.Module, name: str, opts: _Options) -> nn.Module:
    """``module`` with every trainable parameter in a perturbed module (see the module docstring). One module
    object registered under several names (``nn.Sequential(l, act, l)``) becomes one converted object."""
    done = opts.converted.get(id(module))
    if done is None:
        done = opts.converted[id(module)] = Converted(module, _swap_new(module, name, opts))
    return done.result


def _swap_new(module: nn.Module, name: str, opts: _Options) -> nn.Module:
    if isinstance(module, PerturbedModule):
        _check_converted(module, name, opts)
        return module
    if isinstance(module, nn.TransformerEncoder):  # nested tensors cannot carry population rows
        module.enable_nested_tensor = module.use_nested_tensor = False
    frozen_low_bit = opts.bits is not None and type(module) in LOW_BIT_SWAPS  # quantised though it does not evolve
    if not frozen_low_bit and not any(p.requires_grad for p in module.parameters()) and not any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        return module  # nothing to perturb, and no batch statistics to keep apart: it runs as it is
    label = f"{name or 'model'} ({type(module).__name__})"
    if name in opts.fallback:
        return _fallback(module, name, label, opts, "is named in convert(..., fallback=[...])")
    if parametrize.is_parametrized(module):
        return _fallback(module, name, label, opts, "has parametrized weights (weight_norm, spectral_norm, ...)")
    _swap_path(module, label)
    converted = _rebuild_known(module, name, label, opts)
    if converted is None and any(p.requires_grad for p in own_parameters(module).values()):
        converted = _adopt_or_fallback(module, name, label, opts)
        if converted is module and not converted.owns_children:  # a form took its own parameters: children follow
            converted = None
    if converted is not None:
        return converted
    # every slot, even a module registered twice (named_children yields it once)
    for child_name, child in [(n, c) for n, c in module._modules.items() if c is not None]:
        setattr(module, child_name, _swap(child, f"{name}.{child_name}" if name else child_name, opts))
    return module


def _check_converted(module: PerturbedModule, name: str, opts: _Options) -> None:
    """A module converted already keeps its kind: asking for another one is an error, not a no-op."""
    wanted = opts.kind if opts.kind.supports(module.product) else Gaussian()
    kinds = {slot.kind for slot in module.slots if slot.geometry is not None}
    if kinds and kinds != {wanted}:
        raise ValueError(f"{name or 'model'} ({type(module).__name__}) is converted already with kind "
                         f"{', '.join(sorted(map(repr, kinds)))}; convert() does not change a converted module's kind "
                         f"to {opts.kind!r}: convert the original (plain) model")


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


def _rebuild_known(module: nn.Module, name: str, label: str, opts: _Options) -> nn.Module | None:
    """A torch module type with a perturbed class, rebuilt with its weights; None for any other."""
    conversion = conversion_for(module)
    if conversion is None or type(module).forward is not conversion.source.forward or not conversion.fits(module):
        return None  # a subclass with its own forward, or options the class lacks: the exact fallback
    module_kind = _kind_for(conversion.product, label, opts)
    extra = {} if conversion.product is None else {"kind": module_kind}
    target = conversion.target
    if opts.bits is not None and conversion.product is not None:
        if conversion.source not in LOW_BIT_SWAPS:
            raise ValueError(f"bits={opts.bits}: {label} has no low-bit version; expected only Linear and "
                             f"Conv1d/2d/3d to hold trainable matrices, or freeze it with "
                             f"convert(..., freeze=[{name!r}])")
        target, extra = LOW_BIT_SWAPS[conversion.source], {**extra, "bits": opts.bits, "noise_on": opts.noise_on}
        if opts.act_bits is not None:
            if conversion.source is not nn.Linear:
                raise ValueError(f"act_bits={opts.act_bits}: {label} has no int8-activation version; expected "
                                 f"only Linear layers to be low-bit, or freeze it with convert(..., freeze=[{name!r}])")
            extra["act_bits"] = opts.act_bits
    try:
        return _rebuild(target, module, {**conversion.args(module), **extra}, opts.directions)
    except ValueError as e:
        params = [f"{name}.{n}" if name else n for n, p in module.named_parameters() if p.requires_grad]
        raise ValueError(f"cannot perturb parameters {params} of {label}: {e}; freeze them with "
                         f"convert(..., freeze=[...])") from e


def _kind_for(product: str | None, label: str, opts: _Options) -> Kind:
    """The model's kind, or IID Gaussian (with a note) where it has no ``product``."""
    if product is None or opts.kind.supports(product):
        return opts.kind
    opts.notes.append(f"{label}: kind {opts.kind.name!r} has no {product} product; it takes IID Gaussian noise")
    return Gaussian()


def _adopt_or_fallback(module: nn.Module, name: str, label: str, opts: _Options) -> nn.Module:
    """A module form's batched version (transformers' types, the user's registered ones), else the exact
    torch.func fallback."""
    found = recognise(module)
    if opts.bits is not None and (found is None or found[0].product is not None):
        reason = ("has no low-bit version" if found else
                  "would need the torch.func fallback, which has no low-bit version")
        raise ValueError(f"bits={opts.bits}: {label} {reason}; expected only Linear and Conv1d/2d/3d to hold "
                         f"trainable matrices, or freeze it with convert(..., freeze=[{name!r}])")
    if found is not None:
        form, what = found
        return form.adopt(module, what, _kind_for(form.product, label, opts), opts.directions)
    return _fallback(module, name, label, opts, "has no batched perturbed version")


def _fallback(module: nn.Module, name: str, label: str, opts: _Options, why: str) -> nn.Module:
    """``module`` and its children in the exact torch.func fallback (with a note saying why)."""
    if opts.bits is not None:
        raise ValueError(f"bits={opts.bits}: {label} {why} and would need the torch.func fallback, which has no "
                         f"low-bit version; expected only Linear and Conv1d/2d/3d to hold trainable matrices, or "
                         f"freeze it with convert(..., freeze=[{name!r}])")
    if any(isinstance(m, (nn.modules.batchnorm._BatchNorm, PerturbedModule)) for m in module.modules()):
        raise ValueError(f"{label} needs the torch.func fallback, but contains a BatchNorm or a perturbed module, "
                         f"which it cannot evaluate member by member; freeze it with convert(..., freeze=[{name!r}])")
    opts.notes.append(f"{label} {why}; it runs through the exact torch.func fallback, member by member (slow)")
    return functional_fallback(module, opts.directions)


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


def rebuilt_as(cls: type[nn.Module], module: nn.Module, **args) -> nn.Module:
    """``cls(**args)`` holding ``module``'s state, on its device and in its dtype, with its very Parameter
    objects (an optimizer built on ``module`` still holds what trains; ties stay ties). Built on "meta", so
    that no initialisation runs (and no global RNG is consumed), then filled in."""
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), None)
    device = tensors[0].device if tensors else torch.device("cpu")
    layer = cls(**args, device="meta", dtype=dtype).to_empty(device=device)
    layer.load_state_dict(module.state_dict())
    own = dict(layer.named_parameters())
    for name, param in module.named_parameters():
        if name in own and own[name].shape == param.shape and own[name].dtype == param.dtype:
            owner, _, leaf = name.rpartition(".")
            layer.get_submodule(owner).register_parameter(leaf, param)
    return layer


def _rebuild(cls, module, args, directions):
    layer = rebuilt_as(cls, module, **args, directions=directions)
    trainable = {n: p.requires_grad for n, p in module.named_parameters()}
    for n, p in layer.named_parameters():
        p.requires_grad_(trainable.get(n, True))
    for m in layer.modules():
        if isinstance(m, PerturbedModule):
            m.declare_parameters()  # frozen parameters (requires_grad=False) get no noise
    layer.train(module.training)
    return layer


# ----- tied parameters -------------------------------------------------------------------------------
def own_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters ``module`` holds itself, by attribute, without those a child of it holds too (BERT's
    LM-head bias, registered on the head and on its decoder: the decoder's, which perturbs it)."""
    inner = {id(p) for child in module.children() for p in child.parameters()}
    return {name: p for name, p in module.named_parameters(recurse=False) if id(p) not in inner}


def tied_uses(model: nn.Module) -> list[list[tuple[str, str]]]:
    """The trainable parameters used by several modules, each as its (module name, attribute) uses; a
    module holding a parameter that a child of it holds too is not a use (see :func:`own_parameters`)."""
    uses: dict[int, list[tuple[str, str]]] = {}
    for module_name, module in model.named_modules():
        for attr, p in own_parameters(module).items():
            if p.requires_grad:
                uses.setdefault(id(p), []).append((module_name, attr))
    return [group for group in uses.values() if len(group) > 1]


def _guard_aliases(model: nn.Module) -> None:
    """A module holding a parameter that a perturbed child of it perturbs reads it as that child's, guarded:
    its metadata passes, any other use in a population call needs the module in the exact fallback."""
    for module in model.modules():
        if isinstance(module, PerturbedModule):
            continue
        own = own_parameters(module)
        held = {id(p): attr for attr, p in module.named_parameters(recurse=False) if attr not in own}
        aliases = {held[id(q)]: Alias(m, name) for m in module.modules() if held and isinstance(m, PerturbedModule)
                   for name, q in m.perturbed_parameters().items() if id(q) in held}
        if aliases:
            swap_class(module, AliasHolder, "Aliased")
            module.__dict__[ALIASES] = aliases


def _retie(model: nn.Module, ties: list[list[tuple[str, str]]]) -> None:
    """Make each tied group one Parameter again, drawn and updated by one module, borrowed by the others."""
    for group in ties:
        uses = [(model.get_submodule(m), attr, f"{m}.{attr}" if m else attr) for m, attr in group]
        name = uses[0][2]  # the name named_parameters gives the tied tensor (its first use): what freeze takes
        for module, _, full in uses:
            if not isinstance(module, PerturbedModule) or isinstance(module, FunctionalPerturbed):
                raise ValueError(f"tied parameter {full!r} is used by {type(module).__name__}, which has no batched "
                                 f"perturbed version to share its noise; untie it, or freeze it with "
                                 f"convert(..., freeze=[{name!r}])")
        uses.sort(key=lambda use: not isinstance(use[0], nn.Embedding))  # a table owns: its padding row stays zero
        problems = []
        for owner, owner_attr, label in uses:  # the first use whose kind has every other use's product
            problems = [p for module, attr, _ in uses if module is not owner
                        for p in [module.borrow_problem(attr, owner, owner_attr)] if p]
            if not problems:
                for module, attr, _ in uses:
                    if module is not owner:
                        setattr(module, attr, getattr(owner, owner_attr))
                        module.borrow(attr, owner, owner_attr, label)
                break
        if problems:
            raise ValueError(f"tied parameters {[full for *_, full in uses]} cannot share one noise: {problems[0]}")


def _settle(model: nn.Module, ties: list[list[tuple[str, str]]]) -> None:
    """The converted model's ties made again, its aliases guarded, each kind's options checked against it."""
    _retie(model, ties)
    _guard_aliases(model)
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
