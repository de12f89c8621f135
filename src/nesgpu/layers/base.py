"""What every perturbed module shares: its perturbed parameters, their noise, the layout, the update.

A perturbed module is its torch parent (same parameters, same state_dict, same plain forward) plus a list
of :class:`Slot` s, one per trainable parameter: the parameter's name, the :class:`nesgpu.kinds.Kind`
that perturbs it and its geometry. Matrices take the module's kind; vectors (biases, norm scales) take
IID Gaussian noise. The math lives in the kinds; a module's population forward calls
``add_product_`` / ``add_vector_`` / ``member_values`` for each of its parameters. Its perturbation state
is one object it owns, ``module.perturbation`` (:class:`.perturbation.Perturbation`).

Layout: a population input has ``R * D`` rows on its first dimension, laid out (repeats, directions);
row ``n`` uses direction ``n % D``. ``scale`` has shape (R,): ``sigma`` for each repeat, negated for the
second half of the repeats with antithetic sampling.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torch import nn

from ..kinds import KINDS, Gaussian, Geometry, Kind, Noise, Op
from ..noise import NoiseSource
from .drawing import draw_noise
from .estimate import accumulate_grad, apply_update
from .layout import Cached, PopulationCall, RowLayout, check_rows, repeat_scale, tokens_per_row
from .perturbation import Perturbation
from .plan import MAX_PLANS, CallPlan, call_key
from .products import LinearProducts
from .scales import ScaledNoise
from .sharing import SharedParameters
from .slots import Active, Slot

PLANNED_BY = ("population_forward", "_shared_base", "perturbed_linear", "call_plan")  # what a plan stands in for

VECTOR = Gaussian()
"""The kind of every parameter that is not a matrix: IID Gaussian, elementwise."""


class PerturbedModule(LinearProducts, SharedParameters, ScaledNoise):
    """Noise state and the population contract shared by all perturbed modules.

    Outside a :class:`nesgpu.PerturbedModel` call the module is exactly its torch parent.
    """

    directions: int | None
    perturbation: Perturbation

    def init_perturbation(self, kind: Kind, directions: int | None, matrices: dict[str, Geometry],
                          product: str, recurse: bool = False, transposed: frozenset[str] = frozenset(),
                          banks: frozenset[str] = frozenset()) -> None:
        """Declare the perturbed parameters: ``matrices`` (name -> geometry) take ``kind``; every other
        trainable parameter of this module (not of its children) is perturbed elementwise. Parameters
        with ``requires_grad=False`` stay frozen. A matrix named in ``transposed`` is stored as (in, out)
        (GPT-2's Conv1D): its noise, update and dense z_d are those of the (out, in) geometry, transposed.
        A matrix named in ``banks`` is a bank of ``groups`` matrices (E, out/E, in/E) (MoE experts); in both,
        a bank of matrices each stored (in, out)."""
        if directions is not None and (isinstance(directions, bool) or not isinstance(directions, int)
                                       or directions < 1):
            raise ValueError(f"directions must be a positive int; got {directions!r}")
        if not isinstance(kind, Kind):
            raise TypeError(f"kind must be a nesgpu.kinds.Kind; got {type(kind).__name__}")
        if matrices and not kind.supports(product):
            raise ValueError(f"kind {kind.name!r} has no {product} product; for {type(self).__name__} use one of "
                             f"{sorted(k for k, cls in KINDS.items() if product in cls.products)}")
        self.kind = kind
        self.directions = directions
        self.layer_key, self.layer_name = 0, ""  # set by PerturbedModel: the module's key and name in the model
        self.perturbation = Perturbation(matrices, recurse, transposed, banks)
        self.product = product  # what its matrices take from a kind: "linear", "conv", "embedding", ...
        self.population_layout: RowLayout | None = None  # the model's population input, once it is seen
        self.declare_parameters()
        self.population_calls = 0  # 1 once the noise was used since ``perturbing`` began (the bypass check)

    # ----- parameters and noise ----------------------------------------------------------------------
    def declare_parameters(self) -> None:
        """(Re)build the list of perturbed parameters from their ``requires_grad`` flags: call it after
        freezing or unfreezing a parameter of a converted module."""
        state, slots = self.perturbation, []
        for name, p in self.named_parameters(recurse=state.recurse):
            if not p.requires_grad or name in state.borrowed:
                continue
            geometry = state.matrices.get(name)
            if geometry is not None:
                stored = geometry.shape[::-1] if name in state.transposed else geometry.shape
                if name in state.banks:  # (E, out/E, in), or (E, in, out/E) when each matrix is stored transposed
                    each = (geometry.out // geometry.groups, geometry.shape[1])
                    stored = (geometry.groups, *(each[::-1] if name in state.transposed else each))
                if tuple(p.shape) != stored:
                    raise ValueError(f"{name}: shape {tuple(p.shape)} does not match its geometry {stored}")
                self.kind.check(geometry)
            slots.append(Slot(name, self.kind if geometry is not None else VECTOR, geometry))
        state.slots = slots
        state.guarded = frozenset(slot.name for slot in slots) | frozenset(state.borrowed)
        state.noise, state.plans = None, {}

    def perturbed_parameters(self) -> dict[str, nn.Parameter]:
        """The parameters this module perturbs and updates, by attribute name (not those it borrows)."""
        return {slot.name: self.get_parameter(slot.name) for slot in self.perturbation.slots}

    @property
    def slots(self) -> tuple[Slot, ...]:
        """This module's perturbed parameters with their kinds and geometries (not those it borrows)."""
        return tuple(self.perturbation.slots)

    @property
    def owns_children(self) -> bool:
        """Whether this module perturbs its children's parameters too; if not, ``convert`` converts its
        children on their own (an attention module with a vector of its own, such as attention sinks)."""
        return self.perturbation.recurse

    @property
    def perturbs(self) -> bool:
        """Whether this module perturbs any parameter (a module with all of them frozen does not)."""
        return bool(self.perturbation.slots)

    def perturbed_numel(self) -> int:
        """How many scalars this module perturbs (the dimension of its part of z_d)."""
        return sum(p.numel() for p in self.perturbed_parameters().values())

    @property
    def needs_antithetic(self) -> bool:
        """Whether one of this module's kinds is biased without antithetic pairs (see kinds.permuted)."""
        return any(slot.kind.needs_antithetic for slot in self.perturbation.slots)

    def set_noise(self, seed: int, step: int, start: int = 0, stop: int | None = None) -> None:
        """Draw the noise of directions ``[start, stop)`` of ``step`` (default: all), times its scales (scales.py)."""
        if self.directions is None:
            raise ValueError(f"{type(self).__name__}.directions is not set; wrap the model in PerturbedModel")
        stop = self.directions if stop is None else stop
        if not 0 <= start < stop <= self.directions:
            raise ValueError(f"direction range must lie in [0, {self.directions}]; got [{start}, {stop})")
        state, previous = self.perturbation, self.perturbation.noise
        state.noise, state.plans = None, {}  # free the old noise before drawing the new (or reuse it)
        if not state.slots:
            state.drawn, state.noise = range(start, stop), {}
            return
        params = self.perturbed_parameters()
        device = next(iter(params.values())).device
        src = state.source
        if src is None or src.seed != seed or src.layer != self.layer_key or src.generator.device != device:
            src = state.source = NoiseSource(seed, self.layer_key, device)
        shapes = {slot.name: self._noise_shape(slot, params[slot.name]) for slot in state.slots}
        state.noise = self.apply_scales(draw_noise(state.slots, params, shapes, src, previous, step, start, stop))
        state.drawn = range(start, stop)

    def _noise_shape(self, slot: Slot, p: torch.Tensor) -> tuple[int, ...]:
        if not self.stored_as_drawn(slot.name):
            return slot.geometry.shape
        return tuple(p.shape)

    def free_memory(self) -> None:
        """Drop the noise tensors. The next population call needs a new ``set_noise``."""
        self.perturbation.noise, self.perturbation.plans = None, {}

    @property
    def noise_range(self) -> range | None:
        """The directions the current noise covers (None before set_noise or after free_memory)."""
        return self.perturbation.drawn if self.perturbation.noise is not None else None

    @property
    def local_directions(self) -> int:
        """How many directions the current noise covers (the whole population unless chunked)."""
        return len(self.perturbation.drawn)

    def noise_record(self, name: str) -> Noise | None:
        """The current noise of parameter ``name`` (None without noise or for a frozen parameter)."""
        noise = self.perturbation.noise
        return None if noise is None else noise.get(name)

    def noise_bytes(self) -> int:
        """Memory of the current noise tensors, in bytes."""
        noise = self.perturbation.noise or {}
        return sum(t.numel() * t.element_size() for n in noise.values() for t in n.tensors.values())

    def require_noise(self) -> dict[str, Noise]:
        """The current noise by parameter; a ValueError before ``set_noise`` (or after ``free_memory``)."""
        if self.perturbation.noise is None:
            raise ValueError(f"{type(self).__name__} has no noise: call set_noise() before a population forward")
        return self.perturbation.noise

    # ----- estimator ---------------------------------------------------------------------------------
    def accumulate_grad(self, coef: torch.Tensor, into: dict[str, torch.Tensor] | None = None) -> None:
        """Add ``sum_d coef_d z_d`` (the noise as evaluated) to ``.grad``: see :func:`.estimate.accumulate_grad`."""
        accumulate_grad(self, coef, into)

    def apply_update_(self, coef: torch.Tensor, generator, rule) -> None:
        """Every perturbed parameter stepped in place by ``rule`` from ``sum_d coef_d z_d``: see
        :func:`.estimate.apply_update`."""
        apply_update(self, coef, generator, rule)

    def noise_sq_norms(self) -> torch.Tensor:
        """||z_d||^2 (of S o z_d with a scale) over every perturbed parameter of each local direction, shape (D,)."""
        noise = self.require_noise()
        return sum(slot.kind.sq_norms(noise[slot.name]) for slot in self.perturbation.slots)

    def dense_noise(self) -> dict[str, torch.Tensor]:
        """The noise z_d of every local direction as evaluated (S o z_d with a scale) as dense tensors, for tests
        and inspection: ``{"weight": (D, *weight.shape), "bias": (D, out), ...}``."""
        noise = self.require_noise()
        return {slot.name: self.as_stored(slot.name, slot.kind.dense(noise[slot.name]).reshape(
            self.local_directions, *noise[slot.name].shape)) for slot in self.perturbation.slots}

    def as_stored(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """t (N, *noise shape) in the layout the parameter is stored in, (N, *param shape): a transposed
        matrix (Conv1D) is transposed back, a bank of matrices (MoE experts) reshaped to (E, out, in) (and each
        matrix transposed back where the bank stores them (in, out): GPT-OSS's)."""
        shape, state = self.get_parameter(name).shape, self.perturbation
        if name in state.banks and name in state.transposed:
            return t.reshape(t.shape[0], shape[0], shape[2], shape[1]).transpose(2, 3)
        if name in state.transposed:
            return t.transpose(1, 2)
        return t.reshape(t.shape[0], *shape)

    def stored_as_drawn(self, name: str) -> bool:
        """Whether parameter ``name`` is stored in its noise's layout (no transpose, no bank of matrices)."""
        return name not in self.perturbation.transposed and name not in self.perturbation.banks

    # ----- population forward ------------------------------------------------------------------------
    @contextmanager
    def perturbing(self, sigma: float, antithetic: bool):
        """Within this block, ``forward`` evaluates the population. A block inside another (``pm(x)`` within
        ``pm.perturbing()``) leaves the outer one as it found it, its use of the noise counted."""
        if self.needs_antithetic and not antithetic:
            raise ValueError(f"{type(self).__name__} uses kind {self.kind.name!r}, which is biased without "
                             f"antithetic sampling; use antithetic=True or another kind")
        state, own = self.__dict__, self.perturbation  # plain attributes, without nn.Module.__setattr__'s checks
        outer = own.active, state["population_layout"], state["population_calls"]
        own.active, own.plans, state["population_calls"] = Active(float(sigma), bool(antithetic)), {}, 0
        try:
            yield self
        finally:
            own.active, own.plans, state["population_layout"] = outer[0], {}, outer[1]
            state["population_calls"] = max(outer[2], state["population_calls"])

    @property
    def is_perturbing(self) -> bool:
        return self.perturbation.active is not None

    @property
    def label(self) -> str:
        """The module as errors name it: its name in the model and its class."""
        return f"{self.layer_name or 'module'} ({type(self).__name__})"

    def population_of(self, rows: int, dtype: torch.dtype, device: torch.device) -> PopulationCall:
        """Check that ``rows`` is R x D (R even with antithetic sampling) and return R, D and the scale in
        ``dtype``, the dtype the perturbation is added in (see :func:`compute_dtype`)."""
        self.require_noise()
        if not self.ROW_WISE:
            check_rows(self.__dict__["population_layout"], rows, self.label, self.layer_name)
        d = self.local_directions
        if rows % d or not rows:
            raise ValueError(f"{type(self).__name__}: input has {rows} rows; expected a positive multiple of "
                             f"directions={d} laid out as (repeats, directions, ...)")
        r, state = rows // d, self.perturbation
        if state.active.antithetic and r % 2:
            raise ValueError(f"{type(self).__name__}: antithetic sampling needs an even number of repeats; input "
                             f"has {rows} rows = {r} repeats x {d} directions")
        # kept while repeats, sigma, dtype and device stay the same (an RL rollout calls the module hundreds
        # of times per step with the same ones); read-only
        if state.repeat_scale is not None and torch.compiler.is_compiling():
            # a compiled rollout step: the eager first step of the rollout filled the cache for this rollout's
            # repeats and sigma; checking the key would make the program depend on sigma (a recompile per value)
            return PopulationCall(r, d, *state.repeat_scale.value)
        key = (r, *state.active, dtype, device)
        if state.repeat_scale is None or state.repeat_scale.key != key:
            scale = repeat_scale(r, *state.active, torch.empty(0, dtype=dtype, device=device))
            state.repeat_scale = Cached(key, (scale, scale[:: r // 2 if state.active.antithetic else r].clone()))
        return PopulationCall(r, d, *state.repeat_scale.value)

    def noise_of(self, name: str, dtype: torch.dtype) -> Noise | None:
        """The noise of parameter ``name`` in the compute dtype (a tied one's from its owner), or None when it is
        frozen."""
        tie = self.perturbation.borrowed.get(name)
        noise = tie.owner.noise_record(tie.name) if tie is not None else self.require_noise().get(name)
        if noise is None:
            return None
        if not self.population_calls:  # set once: a compiled rollout step must not see a changing counter
            self.population_calls = 1
        return noise.to(dtype)

    def add_product_(self, name: str, op: Op, x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> None:
        """y += scale_r (x_{r,d} times z_d) for the matrix parameter ``name``; x, y laid out (R, D, ...)."""
        noise = self.noise_of(name, y.dtype)
        if noise is not None:
            self.slot_of(name).kind.apply_(op, x, y, scale, noise)

    def add_vector_(self, name: str, op: Op, y: torch.Tensor, scale: torch.Tensor, part: slice | None = None) -> None:
        """y += scale_r z_d on the op's channel dimension, for a vector parameter (a bias; entries ``part``)."""
        noise = self.noise_of(name, y.dtype)
        if noise is not None:
            z = noise["z"] if part is None else noise["z"][:, part]
            y.addcmul_(op.per_channel(z, y), op.per_repeat(scale, y))

    def member_values(self, name: str, pop: PopulationCall, dtype: torch.dtype) -> torch.Tensor:
        """theta + scale_r z_d for every member: (R, D, *shape); a frozen parameter is (1, 1, *shape), which
        broadcasts against it."""
        p = self.get_parameter(name)
        noise = self.noise_of(name, dtype)
        if noise is None:
            return p.to(dtype).view(1, 1, *p.shape)
        z = noise["z"].unsqueeze(0)
        return torch.addcmul(p.to(dtype).view(1, 1, *p.shape), z, pop.scale.view(-1, 1, *([1] * p.dim())))

    def slot_of(self, name: str) -> Slot:
        """The slot of parameter ``name`` (a tied one's: its owner's); a KeyError if it is not perturbed."""
        tie = self.perturbation.borrowed.get(name)
        if tie is not None:
            return tie.owner.slot_of(tie.name)
        for slot in self.perturbation.slots:
            if slot.name == name:
                return slot
        raise KeyError(name)

    def extra_repr(self) -> str:
        base = super().extra_repr()
        parts = [base] if base else []
        parts += [f"kind={self.kind!r}", f"directions={self.directions}"]
        frozen = [n for n, p in self.named_parameters(recurse=self.owns_children) if not p.requires_grad]
        if frozen:
            parts.append(f"frozen={frozen}")
        if self.perturbation.borrowed:
            parts.append("tied={" + ", ".join(f"{n!r}: {b.label!r}" for n, b in self.perturbation.borrowed.items())
                         + "}")
        return ", ".join(parts)

    ROW_WISE = False
    """Whether output row i depends only on input row i, whatever the dimensions between the rows and the
    features (Linear, Embedding, LayerNorm): such a module takes its rows' tokens flattened, (rows * T, ...)."""

    def forward(self, *args, **kwargs):
        state = self.perturbation  # plain attributes, read and set directly: this runs per layer per decode step
        if state.active is None:
            return super().forward(*args, **kwargs)
        if self.PLANNED and len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor) and (
                not torch.compiler.is_compiling()):
            x, plans = args[0], state.plans
            key = call_key(x, self.__dict__["population_layout"])
            plan = plans.get(key)
            if plan is None:  # once per kind of input in a population call (plan.py)
                if len(plans) >= MAX_PLANS:
                    plans.clear()
                plan = plans[key] = CallPlan(key, self.call_plan(x, key[-1]))
            if plan.run is not None:
                return plan.run(x)
        inside, state.inside = state.inside, True  # as own_call(), without a generator's cost
        try:
            return self._population_call(args, kwargs)
        finally:
            state.inside = inside

    def _population_call(self, args: tuple, kwargs: dict):
        x = args[0] if args else None
        if self.ROW_WISE and isinstance(x, torch.Tensor):
            layout = self.__dict__["population_layout"]
            if layout is not None and x.dim() and x.shape[0] == 1 < layout.rows:  # one row every member shares
                x = x.expand(layout.rows, *x.shape[1:])
                args = (x, *args[1:])
            tokens = tokens_per_row(layout, x, self.label, self.layer_name)
            if tokens:  # (rows * T, ...) as (rows, T, ...): token j belongs to row j // T
                return self.population_forward(x.view(-1, tokens, *x.shape[1:]), *args[1:], **kwargs).flatten(0, 1)
        return self.population_forward(*args, **kwargs)

    PLANNED = False
    """Whether :meth:`call_plan` may stand in for the population forward of a one-tensor call. A subclass that
    defines its own ``population_forward`` (or ``_shared_base``: a low-bit layer) is not planned unless it says so."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "PLANNED" in cls.__dict__:
            return
        said = next(c for c in cls.__mro__ if "PLANNED" in c.__dict__)  # the class whose forward the plan is
        if any(getattr(cls, name, None) is not getattr(said, name, None) for name in PLANNED_BY):
            cls.PLANNED = False  # a method the plan stands in for differs here (a mixin's, a subclass's)

    def call_plan(self, x: torch.Tensor, layout: RowLayout | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A function computing ``population_forward(x)`` for inputs like ``x`` (:func:`nesgpu.layers.plan.call_key`)
        during this population call, or None (the general path then runs). Modules with ``PLANNED`` give one."""
        return None

    def population_forward(self, *args, **kwargs):
        raise NotImplementedError
