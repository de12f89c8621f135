"""PerturbedModel: runs a whole ES population through a model in one batched forward pass; convert."""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn
from torch.nn.utils import parametrize

from .kinds import Gaussian, Kind, make_kind
from .layers import PerturbedModule, functional_fallback
from .layers.base import repeat_signs
from .layers.lowbit import NOISE_ON
from .layers.registry import LOW_BIT, PATH_SWAPS, conversion_for
from .quantize import check_bits


def direction_blocks(directions: range, size: int | None) -> list[range]:
    """``directions`` cut into consecutive blocks of at most ``size`` (one block when size is None)."""
    size = size or len(directions)
    return [range(a, min(a + size, directions.stop)) for a in range(directions.start, directions.stop, size)]


def uncovered_parameters(model: nn.Module) -> list[str]:
    """Names of the trainable parameters of ``model`` that no perturbed module perturbs."""
    covered = {id(p) for m in model.modules() if isinstance(m, PerturbedModule)
               for p in m.perturbed_parameters().values()}
    return [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in covered]


class PerturbedModel:
    """Wraps a model whose parameterised modules are perturbed modules (see :func:`convert`).

    ``model(x)`` stays the plain, unperturbed model. ``pm(x)``, or any method of the model inside
    ``with pm.perturbing():``, runs the model in population mode (without autograd): its input is laid out
    as (repeats, directions, ...) on the first dimension, row ``n`` evaluating ``theta + sigma * s_r * z_d``
    with ``d = n % D`` and ``r = n // D``; ``s_r = -1`` for ``r >= R/2`` with ``antithetic=True``, else +1.

    Args:
        model: the model; every trainable parameter must be perturbed by one of its perturbed modules.
        directions: population size D (number of noise directions).
        sigma: noise scale.
        antithetic: evaluate each direction with both signs (the input's repeats R must be even).
        seed: noise seed. Direction d's noise depends only on (seed, step, module, d).

    Example:
        >>> net = convert(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), "lowrank")
        >>> pm = PerturbedModel(net, directions=64, sigma=0.05)
        >>> opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        >>> pm.set_noise()
        >>> losses = loss_fn(pm(x.expand(64, 4)), y)   # shape (64,)
        >>> opt.zero_grad(); pm.update(losses); opt.step()
    """

    def __init__(self, model: nn.Module, directions: int, sigma: float = 0.02, antithetic: bool = False,
                 seed: int = 0):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
        if isinstance(directions, bool) or not isinstance(directions, int) or directions < 1:
            raise ValueError(f"directions must be a positive int; got {directions!r}")
        self.model = model
        self.directions = directions
        self.sigma = sigma
        self.antithetic = bool(antithetic)
        self.seed = int(seed)
        self.step = 0
        self.layers: dict[str, PerturbedModule] = {
            name: m for name, m in model.named_modules() if isinstance(m, PerturbedModule)
        }
        if not any(layer.perturbs for layer in self.layers.values()):
            raise ValueError("model has no perturbed parameters; call nesgpu.convert(model, kind) first")
        owners: dict[int, str] = {}
        for name, layer in self.layers.items():
            for pname, p in layer.perturbed_parameters().items():
                full = f"{name}.{pname}" if name else pname
                if id(p) in owners:
                    raise ValueError(f"parameter {full!r} is perturbed twice (also as {owners[id(p)]!r}): nested "
                                     f"perturbed modules or tied weights; expected each parameter in one module")
                owners[id(p)] = full
        missing = uncovered_parameters(model)
        if missing:
            raise ValueError(f"trainable parameters {missing} are not perturbed by any perturbed module; convert the "
                             f"model with nesgpu.convert, or freeze them (requires_grad=False)")
        for name, layer in self.layers.items():
            if layer.directions not in (None, directions):
                raise ValueError(f"module {name!r} was built for directions={layer.directions}; expected {directions}")
            if layer.needs_antithetic and not self.antithetic:
                raise ValueError(f"module {name!r} uses kind {layer.kind!r}, whose directions of one step share "
                                 f"their noise and are biased without antithetic sampling; expected "
                                 f"antithetic=True (or another kind)")
            layer.directions = directions
            layer.layer_key = zlib.crc32(name.encode())  # stable across processes and runs

    @property
    def sigma(self) -> float:
        return self._sigma

    @sigma.setter
    def sigma(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"sigma must be a positive number; got {value!r}")
        self._sigma = float(value)

    def parameters(self) -> list[nn.Parameter]:
        """Every perturbed parameter (what the ES update writes .grad into)."""
        return [p for layer in self.layers.values() for p in layer.perturbed_parameters().values()]

    # ----- noise -------------------------------------------------------------------------------------
    def set_noise(self, step: int | None = None, directions: range | None = None) -> None:
        """Draw the noise of the next step (or of ``step``) for all directions or a ``range`` of them.

        Without arguments, ``self.step`` advances by one, so every call gives new noise. Chunked and
        distributed evaluation pass the same ``step`` with disjoint ``directions`` ranges.
        """
        step = self.step + 1 if step is None else int(step)
        if directions is None:
            directions = range(self.directions)
        if not isinstance(directions, range) or directions.step != 1:
            raise TypeError(f"directions must be a contiguous range; got {directions!r}")
        if not 0 <= directions.start < directions.stop <= self.directions:
            raise ValueError(f"directions must be a non-empty range within [0, {self.directions}); got {directions!r}")
        self.step = step
        for layer in self.layers.values():
            layer.set_noise(self.seed, step, directions.start, directions.stop)

    def free_memory(self) -> None:
        """Drop every module's noise (e.g. before saving); the next population call needs ``set_noise``."""
        for layer in self.layers.values():
            layer.free_memory()

    def dense_noise(self) -> dict[str, torch.Tensor]:
        """Unit-scale noise z_d of every perturbed parameter, densely: ``{"0.weight": (D, out, in), ...}``."""
        return {f"{name}.{key}" if name else key: z
                for name, layer in self.layers.items() for key, z in layer.dense_noise().items()}

    def noise_sq_norms(self) -> torch.Tensor:
        """||z_d||^2 over all perturbed parameters, per local direction: shape (D,)."""
        return sum(layer.noise_sq_norms() for layer in self.layers.values() if layer.perturbs)

    def noise_bytes(self) -> int:
        """Memory of every module's current noise tensors, in bytes."""
        return sum(layer.noise_bytes() for layer in self.layers.values())

    @property
    def num_perturbed(self) -> int:
        """How many scalar parameters are perturbed (the dimension of z_d)."""
        return sum(layer.perturbed_numel() for layer in self.layers.values())

    # ----- population forward ------------------------------------------------------------------------
    @contextmanager
    def perturbing(self) -> Iterator[None]:
        """Inside this block (and without autograd), calls of the model, or of any of its methods,
        evaluate the population. On leaving it, every perturbed module must have used its noise: a module
        whose parent reads its parameters directly (bypassing its forward) is an error, not a silent
        random walk."""
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            for layer in self.layers.values():
                stack.enter_context(layer.perturbing(self.sigma, self.antithetic))
            yield
            unused = [name for name, layer in self.layers.items()
                      if layer.perturbs and layer.population_calls == 0]
            if unused:
                raise RuntimeError(
                    f"perturbed modules {unused} were not used by this population call: a parent module reads their "
                    f"parameters without calling them, so their noise never reaches the output. Convert the parent "
                    f"with nesgpu.layers.functional_fallback before convert(), or freeze them "
                    f"(convert(..., freeze=[...])); a method that uses only part of the model should run with the "
                    f"unused part frozen")

    def __call__(self, *args, **kwargs):
        with self.perturbing():
            return self.model(*args, **kwargs)

    def shared_input(self, x: torch.Tensor) -> torch.Tensor:
        """The population on one input x (B, ...) that every member sees: the same as calling this object
        on x repeated as rows (R, B, D) (R = 2 signs with antithetic sampling, else 1), laid out the same.

        When the model is an nn.Sequential whose first perturbed module is a Linear, reached through
        parameter-free row-wise modules (Flatten, Identity) on 2-D inputs, that Linear computes the plain
        product once per sample and never builds the repeated rows; any other model runs on the rows.
        """
        signs = 2 if self.antithetic else 1
        d = self.local_directions
        entry = self._shared_entry()
        with self.perturbing():
            if entry is not None:
                prefix, first, rest = entry
                h = x
                for module in prefix:
                    h = module(h)
                if h.dim() == 2:
                    h = first.population_forward_shared(h, signs)
                    for module in rest:
                        h = module(h)
                    return h
            rows = x.unsqueeze(0).unsqueeze(2).expand(signs, x.shape[0], d, *x.shape[1:])
            return self.model(rows.reshape(-1, *x.shape[1:]))

    def _shared_entry(self):
        """(row-wise modules before, the first perturbed Linear, the modules after) of a Sequential model
        whose first perturbed module is a Linear, or None."""
        from .layers.linear import PerturbedLinear

        if not isinstance(self.model, nn.Sequential):
            return None
        modules = list(self.model)
        for i, module in enumerate(modules):
            # a subclass with its own population forward qualifies only with its own shared-input forward
            plain = isinstance(module, PerturbedLinear) and (
                type(module).population_forward is PerturbedLinear.population_forward
                or type(module).population_forward_shared is not PerturbedLinear.population_forward_shared)
            if plain:
                return modules[:i], module, modules[i + 1:]
            row_wise = isinstance(module, nn.Identity) or (
                isinstance(module, nn.Flatten) and module.start_dim == 1 and module.end_dim == -1)
            if not row_wise:
                return None
        return None

    # ----- estimator ---------------------------------------------------------------------------------
    def update(self, weights: torch.Tensor) -> None:
        """Add the ES gradient estimate to ``.grad`` of every perturbed parameter.

        ``weights`` of shape (D,) gives ``g = 1/(D sigma) sum_d w_d z_d``; of shape (R, D) it is first
        reduced to ``w_d = 1/R sum_r s_r w[r, d]``. D here is the number of directions the current noise
        covers; the scale always uses the whole population, so chunks' updates add up to the full one.
        With ``weights = losses``, ``optimizer.step()`` descends.
        """
        local = self.local_directions
        if not isinstance(weights, torch.Tensor):
            raise TypeError(f"weights must be a torch.Tensor of shape ({local},) or (R, {local}); "
                            f"got {type(weights).__name__}")
        if weights.dim() == 2 and weights.shape[1] == local:
            repeats = weights.shape[0]
            if self.antithetic and repeats % 2:
                raise ValueError(f"antithetic weights need an even number of repeats; got shape {tuple(weights.shape)}")
            signs = repeat_signs(repeats, self.antithetic, weights.device).to(weights.dtype)
            weights = (signs.view(-1, 1) * weights).mean(0)
        elif weights.shape != (local,):
            raise ValueError(f"weights must have shape ({local},) or (R, {local}); got {tuple(weights.shape)}")
        coef = weights / (self.directions * self.sigma)
        for layer in self.layers.values():
            if layer.perturbs:
                layer.accumulate_grad(coef)

    @property
    def noise_range(self) -> range | None:
        """The directions the current noise covers (None before set_noise or after free_memory)."""
        return next(iter(self.layers.values())).noise_range

    def has_noise(self, step: int, directions: range) -> bool:
        """Whether the current noise is that of ``directions`` at ``step`` (so it need not be drawn again)."""
        return self.step == step and self.noise_range == directions

    @property
    def local_directions(self) -> int:
        """How many directions the current noise covers: rows of a population input are R x this."""
        current = self.noise_range
        if current is None:
            raise ValueError("no noise: call set_noise() before update()")
        return len(current)

    def __repr__(self) -> str:
        return (f"PerturbedModel(directions={self.directions}, sigma={self.sigma}, antithetic={self.antithetic}, "
                f"seed={self.seed}, step={self.step},\n  model={self.model!r})")


def convert(model: nn.Module, kind: str | Kind = "lowrank", directions: int | None = None,
            freeze: Iterable[str] = (), bits: int | None = None, noise_on: str = "latent",
            act_bits: int | None = None, **options) -> nn.Module:
    """Make every trainable parameter of ``model`` perturbable, keeping its weights.

    Linear, Conv1d/2d/3d, Embedding, MultiheadAttention, LSTM/GRU/RNN become perturbed modules whose
    matrices take ``kind``; LayerNorm, RMSNorm, GroupNorm and BatchNorm perturb their affine parameters
    (BatchNorm keeps members apart); transformer layers take their unfused path in population mode. A
    module of another type with trainable parameters of its own runs through the exact (slow) torch.func
    fallback, with a warning. Where ``kind`` has no product for a module (e.g. "permuted" for an
    Embedding, "sparse" for a convolution), that module takes IID Gaussian noise, with a warning.

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
            parameters stay float. A model with another module holding trainable matrices (Embedding,
            attention, recurrent, a torch.func fallback) is refused: freeze those modules.
        noise_on: with ``bits``: "latent" (each member is the quantisation of its perturbed float weights) or
            "quantized" (the noise is added in float to the shared quantised weights).
        act_bits: with ``bits``: None (float activations) or 8: every low-bit Linear quantises its input
            rows to int8 and runs its shared product as an int8 GEMM (a model with a convolution is refused).
        **options: the kind's options, e.g. ``rank=2`` or ``in_sparsity=0.1``.

    Returns:
        the converted model. Its parameters are new objects: build the optimizer after converting.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    kind = make_kind(kind, **options)
    if bits is not None:
        check_bits(bits)
        if noise_on not in NOISE_ON:
            raise ValueError(f"noise_on must be one of {list(NOISE_ON)}; got {noise_on!r}")
    elif noise_on != "latent" or act_bits is not None:
        option = f"act_bits={act_bits!r}" if act_bits is not None else f"noise_on={noise_on!r}"
        raise ValueError(f"{option} applies to low-bit layers; pass bits=1 or bits=8 with it")
    if act_bits is not None and (isinstance(act_bits, bool) or act_bits != 8):
        raise ValueError(f"act_bits must be None (float activations) or 8; got {act_bits!r}")
    _freeze(model, freeze)
    _refuse_tied(model)
    notes: list[str] = []

    def swap(module: nn.Module, name: str) -> nn.Module:
        if isinstance(module, PerturbedModule):
            return module
        if isinstance(module, nn.TransformerEncoder):  # nested tensors cannot carry population rows
            module.enable_nested_tensor = module.use_nested_tensor = False
        frozen_low_bit = bits is not None and type(module) in LOW_BIT  # quantised though it does not evolve
        if not frozen_low_bit and not any(p.requires_grad for p in module.parameters()) and not any(
                isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            return module  # nothing to perturb, and no batch statistics to keep apart: it runs as it is
        if parametrize.is_parametrized(module):
            raise ValueError(f"{name or 'model'} ({type(module).__name__}) has parametrized weights (weight_norm, "
                             f"spectral_norm, ...), which convert cannot perturb; remove the parametrization or freeze "
                             f"it with convert(..., freeze=[{name!r}])")
        path_swap = next((cls for base, cls in PATH_SWAPS.items() if isinstance(module, base)), None)
        if path_swap is not None:
            if type(module).forward is not path_swap.__mro__[1].forward:
                raise ValueError(f"{name or 'model'} ({type(module).__name__}) overrides the forward of "
                                 f"{path_swap.__mro__[1].__name__}, whose fused path reads every weight at once; "
                                 f"expected the torch class or a subclass that keeps its forward")
            module.__class__ = path_swap if type(module) is path_swap.__mro__[1] else type(
                f"Perturbed{type(module).__name__}", (path_swap, type(module)), {"__module__": type(module).__module__})
        conversion = conversion_for(module)
        if conversion is not None and type(module).forward is not conversion.source.forward:
            conversion = None  # a subclass with its own forward: only the exact fallback keeps its maths
        if conversion is not None:
            module_kind = kind
            if conversion.product is not None and not kind.supports(conversion.product):
                module_kind = Gaussian()
                notes.append(f"{name or 'model'} ({type(module).__name__}): kind {kind.name!r} has no "
                             f"{conversion.product} product; it takes IID Gaussian noise")
            extra = {} if conversion.product is None else {"kind": module_kind}
            target = conversion.target
            if bits is not None and conversion.product is not None:
                if conversion.source not in LOW_BIT:
                    raise ValueError(f"bits={bits}: {name or 'model'} ({type(module).__name__}) has no low-bit "
                                     f"version; expected only Linear and Conv1d/2d/3d to hold trainable matrices, "
                                     f"or freeze it with convert(..., freeze=[{name!r}])")
                target, extra = LOW_BIT[conversion.source], {**extra, "bits": bits, "noise_on": noise_on}
                if act_bits is not None:
                    if conversion.source is not nn.Linear:
                        raise ValueError(f"act_bits={act_bits}: {name or 'model'} ({type(module).__name__}) has no "
                                         f"int8-activation version; expected only Linear layers to be low-bit, or "
                                         f"freeze it with convert(..., freeze=[{name!r}])")
                    extra["act_bits"] = act_bits
            try:
                return _rebuild(target, module, {**conversion.args(module), **extra}, directions)
            except ValueError as e:
                params = [f"{name}.{n}" if name else n for n, p in module.named_parameters() if p.requires_grad]
                raise ValueError(f"cannot perturb parameters {params} of {name or 'model'} ({type(module).__name__}): "
                                 f"{e}; freeze them with convert(..., freeze=[...])") from e
        if any(p.requires_grad for p in module.parameters(recurse=False)):
            if bits is not None:
                raise ValueError(f"bits={bits}: {name or 'model'} ({type(module).__name__}) would need the torch.func "
                                 f"fallback, which has no low-bit version; expected only Linear and Conv1d/2d/3d to "
                                 f"hold trainable matrices, or freeze it with convert(..., freeze=[{name!r}])")
            if any(isinstance(m, (nn.modules.batchnorm._BatchNorm, PerturbedModule)) for m in module.modules()):
                raise ValueError(f"{name or 'model'} ({type(module).__name__}) needs the torch.func fallback, but "
                                 f"contains a BatchNorm or a perturbed module, which it cannot evaluate member by "
                                 f"member; freeze it with convert(..., freeze=[{name!r}])")
            notes.append(f"{name or 'model'} ({type(module).__name__}) has no batched perturbed version; it runs "
                         f"through the exact torch.func fallback, member by member (slow)")
            return functional_fallback(module, directions)
        for child_name, child in module.named_children():
            setattr(module, child_name, swap(child, f"{name}.{child_name}" if name else child_name))
        return module

    model = swap(model, "")
    for note in notes:
        warnings.warn(note, stacklevel=2)
    missing = uncovered_parameters(model)
    if missing:  # a safety net: every conversion declares all its trainable parameters
        raise ValueError(f"convert could not perturb trainable parameters {missing}; freeze them with "
                         f"convert(..., freeze=[...])")
    return model


def _refuse_tied(model: nn.Module) -> None:
    """Tied weights (one tensor in two modules) would be rebuilt as two parameters drawing two noises."""
    seen: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if p.requires_grad and id(p) in seen:
            raise ValueError(f"parameters {seen[id(p)]!r} and {name!r} are one tensor (tied weights), which convert "
                             f"would split into two; untie them, or freeze one side with convert(..., freeze=[...])")
        seen.setdefault(id(p), name)


def _freeze(model: nn.Module, names: Iterable[str]) -> None:
    if isinstance(names, str):
        raise TypeError(f"freeze must be a list of parameter or module names; got the string {names!r}")
    names = list(names)
    params = dict(model.named_parameters())
    for name in names:
        matched = [p for n, p in params.items() if n == name or n.startswith(name + ".")]
        if not matched:
            raise ValueError(f"freeze: {name!r} names no parameter or module of the model; expected one of "
                             f"{sorted(params)} or their module prefixes")
        for p in matched:
            p.requires_grad_(False)
    if names and not any(p.requires_grad for p in params.values()):
        raise ValueError(f"freeze={names} leaves no trainable parameter; expected at least one to evolve")


def _rebuild(cls, module, args, directions):
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), None)
    device = tensors[0].device if tensors else torch.device("cpu")
    # Built on "meta" so that no initialisation runs (and no global RNG is consumed), then filled in.
    layer = cls(**args, device="meta", dtype=dtype, directions=directions)
    layer = layer.to_empty(device=device)
    layer.load_state_dict(module.state_dict())
    trainable = {n: p.requires_grad for n, p in module.named_parameters()}
    for n, p in layer.named_parameters():
        p.requires_grad_(trainable.get(n, True))
    for m in layer.modules():
        if isinstance(m, PerturbedModule):
            m.declare_parameters()  # frozen parameters (requires_grad=False) get no noise
    layer.train(module.training)
    return layer
