"""PerturbedModel: runs a whole ES population through a model in one batched forward pass; convert."""

from __future__ import annotations

import numbers
import warnings
import weakref
import zlib
from collections.abc import Callable, Iterator
from typing import TypeVar
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from .autofallback import failing_module, fall_back, fallback_root
from .kinds import check_kind_options
from .layers import PerturbedModule
from .layers.covariance import ModelCovariance
from .layers.guarded_value import NeedsFallback
from .layers.layout import member_weights, one_sequence_per_row, tell_layout
from .layers.scales import ModelScales
from .layers.sequential import shared_forward
from .masters import MasterWeights
from .masters import register as register_masters
from .trainable import check_trainable, uncovered_parameters

T = TypeVar("T")

# the smallest noise scale taken: below it 1 / (D sigma) overflows float32 for large D, and the noise is lost in
# the rounding of any weight larger than 1e-5 anyway (float32 keeps 7 digits)
MIN_SIGMA = 1e-12
MAX_SIGMA = 1e18  # its square, a variance, stays finite in float32 (3.4e38)
MAX_DIRECTIONS = 1 << 24  # 16,777,216: 64x the largest populations published (EGGROLL's 262,144)


def check_sigma(value) -> float:
    """``value`` as a float if it is a noise scale in [:data:`MIN_SIGMA`, :data:`MAX_SIGMA`]; else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_SIGMA <= value <= MAX_SIGMA:
        raise ValueError(f"sigma must be a number in [{MIN_SIGMA:g}, {MAX_SIGMA:g}]; got {value!r}")
    return float(value)


def direction_blocks(directions: range, size: int | None) -> list[range]:
    """``directions`` cut into consecutive blocks of at most ``size`` (one block when size is None)."""
    size = size or len(directions)
    return [range(a, min(a + size, directions.stop)) for a in range(directions.start, directions.stop, size)]


class PerturbedModel(ModelScales, ModelCovariance):
    """Wraps a model whose parameterised modules are perturbed modules (see :func:`convert`).

    ``model(x)`` stays the plain, unperturbed model. ``pm(x)``, or any method of the model inside
    ``with pm.perturbing():``, runs the model in population mode (without autograd): its input is laid out
    as (repeats, directions, ...) on the first dimension, row ``n`` evaluating ``theta + sigma * s_r * z_d``
    with ``d = n % D`` and ``r = n // D``; ``s_r = -1`` for ``r >= R/2`` with ``antithetic=True``, else +1.
    With a sigma per parameter (:meth:`set_scales`), ``z_d`` here and below is ``S o z_d``, the noise as evaluated.

    Args:
        model: the model; every trainable parameter must be perturbed by one of its perturbed modules.
        directions: population size D (number of noise directions).
        sigma: noise scale.
        antithetic: evaluate each direction with both signs (the input's repeats R must be even).
        seed: noise seed. Direction d's noise depends only on (seed, step, module, d).
        masters: give half-precision weights float32 masters that an optimizer steps (default); False: none,
            for an update written into the weights themselves (:meth:`nesgpu.Population.apply`).

    Example:
        >>> net = convert(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), "lowrank")
        >>> pm = PerturbedModel(net, directions=64, sigma=0.05)
        >>> opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        >>> pm.set_noise()
        >>> losses = loss_fn(pm(x.expand(64, 4)), y)   # shape (64,): lower is better
        >>> opt.zero_grad(); pm.update(losses); opt.step()
    """

    def __init__(self, model: nn.Module, directions: int, sigma: float = 0.02, antithetic: bool = False,
                 seed: int = 0, masters: bool = True):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
        if isinstance(directions, bool) or not isinstance(directions, int) or not 1 <= directions <= MAX_DIRECTIONS:
            raise ValueError(f"directions must be an int in [1, {MAX_DIRECTIONS:,}]; got {directions!r}")
        if any(p.is_meta for p in model.parameters()):
            raise ValueError("the model's parameters are on the meta device (shapes without data); materialise "
                             "them first, e.g. model.to_empty(device=...) and load_state_dict(...)")
        check_trainable(model)
        self.model = model
        self.directions = directions
        self.sigma = sigma
        if not isinstance(antithetic, bool):  # "no" would be True
            raise TypeError(f"antithetic must be True or False; got {antithetic!r}")
        self.antithetic = antithetic
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be an int in [0, 2**63); got {seed!r}")
        self.seed = int(seed)
        self.step, self.keeps_masters = 0, bool(masters)
        self._wire()
        if self._masters.dtype is not None:  # plain calls see the latest step (masters), inputs in the model's dtype
            this = weakref.ref(self)  # the hook must not keep this object (and its fp32 copy) alive
            handle = model.register_forward_pre_hook(
                lambda _, args, kwargs: None if this() is None else this()._before_call(args, kwargs), with_kwargs=True)
            weakref.finalize(self, handle.remove)

    def _wire(self) -> None:
        """Find the perturbed modules, check that each trainable parameter is perturbed once, give every module
        its key and name, and make the float32 master weights of half-precision parameters."""
        model, directions = self.model, self.directions
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
            layer.layer_name = name
        check_kind_options((f"{name}.{slot.name}" if name else slot.name, slot.kind, slot.geometry)
                           for name, layer in self.layers.items() for slot in layer.slots)
        perturbed = (p for layer in self.layers.values() for p in layer.perturbed_parameters().values())
        self._masters = MasterWeights(perturbed, getattr(self, "_masters", None), keep=self.keeps_masters)
        register_masters(model, self._masters)

    @property
    def sigma(self) -> float:
        return self._sigma

    @sigma.setter
    def sigma(self, value: float) -> None:
        self._sigma = check_sigma(value)

    def parameters(self) -> list[nn.Parameter]:
        """Every perturbed parameter (what the ES update writes .grad into): build the optimizer on these.

        A model held in bfloat16 or float16 gets float32 master weights: this returns them, the update
        writes their ``.grad`` in float32, and the model's own weights are refreshed from them (rounded to
        the model's dtype) before every call of the model, so a step below half-precision resolution is
        kept. The population forward runs in the model's dtype."""
        return [self._masters.of(p) for layer in self.layers.values() for p in layer.perturbed_parameters().values()]

    def _check_frozen(self) -> None:
        """A parameter frozen (``requires_grad_(False)``) after convert() would still be perturbed and updated:
        an error naming it, not a silent no-op of the freeze."""
        frozen = [f"{name}.{attr}" if name else attr for name, layer in self.layers.items()
                  for attr, p in layer.perturbed_parameters().items() if not p.requires_grad]
        if frozen:
            raise ValueError(f"parameters {frozen[:5]}{' ...' if len(frozen) > 5 else ''} were frozen "
                             f"(requires_grad=False) after convert(), which still perturbs them; freeze them when "
                             f"converting: convert(model, ..., freeze=[...])")

    def _before_call(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A half-precision model's call: its weights from the masters, floating-point inputs in its dtype (a
        task's float32 features meet bfloat16 weights; token ids and masks of other dtypes stay)."""
        self.sync_weights()
        return tuple(self._in_dtype(a) for a in args), {k: self._in_dtype(v) for k, v in kwargs.items()}

    def _in_dtype(self, value):
        if self._masters.dtype is not None and isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return value.to(self._masters.dtype)
        return value

    def sync_weights(self) -> None:
        """Copy master weights that changed since the last copy into the model (nothing without masters)."""
        self._masters.sync()

    def master_state(self) -> dict[str, torch.Tensor]:
        """The float32 master weights by parameter name (empty without masters): what a checkpoint keeps, so
        that a resumed run goes on from the exact weights rather than from their half-precision rounding."""
        return self._masters.state(self.model)

    def load_master_state(self, state: dict[str, torch.Tensor] | None) -> None:
        """Set the master weights from :meth:`master_state` (``None``, or a name it lacks: from the model's
        own weights, e.g. just loaded from a file) and the model's weights from them."""
        self._masters.load_state(self.model, state)

    # ----- noise -------------------------------------------------------------------------------------
    def set_noise(self, step: int | None = None, directions: range | None = None, sigma: float | None = None
                  ) -> None:
        """Draw the noise of the next step (or of ``step``) for all directions or a ``range`` of them, to be
        evaluated at noise scale ``sigma`` (default: :attr:`sigma` as it is).

        Without arguments, ``self.step`` advances by one, so every call gives new noise. Chunked and
        distributed evaluation pass the same ``step`` with disjoint ``directions`` ranges.
        """
        if sigma is not None:
            self.sigma = sigma  # checked by the setter
        if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0):
            raise TypeError(f"step must be an int >= 0; got {step!r}")
        step = self.step + 1 if step is None else int(step)
        if step != self.step:
            self._masters.check_stepped()
        self._check_frozen()
        self.sync_weights()
        if directions is None:
            directions = range(self.directions)
        if not isinstance(directions, range) or directions.step != 1:
            raise TypeError(f"directions must be a contiguous range; got {directions!r}")
        if not 0 <= directions.start < directions.stop <= self.directions:
            raise ValueError(f"directions must be a non-empty range within [0, {self.directions}); got {directions!r}")
        self.step = step
        self.draw_noise(step, directions)

    def free_memory(self) -> None:
        """Drop every module's noise (e.g. before saving); the next population call needs ``set_noise``."""
        for layer in self.layers.values():
            layer.free_memory()

    def dense_noise(self) -> dict[str, torch.Tensor]:
        """The noise z_d of every perturbed parameter as evaluated (S o z_d where :meth:`set_scales` gave a scale),
        densely: ``{"0.weight": (D, out, in), ...}``."""
        return {f"{name}.{key}" if name else key: z
                for name, layer in self.layers.items() for key, z in layer.dense_noise().items()}

    def noise_sq_norms(self) -> torch.Tensor:
        """||z_d||^2 over all perturbed parameters, per local direction: shape (D,) (of S o z_d with scales)."""
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
    def perturbing(self, unused: list[str] | None = None) -> Iterator[None]:
        """Inside this block (and without autograd), calls of the model, or of any of its methods,
        evaluate the population. On leaving it, every perturbed module must have used its noise: a module
        never reached (its noise never reaches the output, and ES would random-walk its weights) is an error,
        or, given a list ``unused``, named in it (:func:`nesgpu.check` reports them)."""
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            for layer in self.layers.values():
                stack.enter_context(layer.perturbing(self.sigma, self.antithetic))
            stack.callback(self.model.register_forward_pre_hook(self._see_rows, with_kwargs=True).remove)
            stack.enter_context(one_sequence_per_row(self.model))
            try:
                yield
            except Exception as e:  # a plain module whose code fails on the rows: exact in the fallback
                raise failing_module(self.model, e) or e  # (the error itself, where it is none)
            found = [name for name, layer in self.layers.items() if layer.perturbs and layer.population_calls == 0]
            if found and unused is not None:
                unused += [name for name in found if name not in unused]
            elif found:
                raise RuntimeError(
                    f"perturbed modules {found} were not used by this population call: their noise never reaches "
                    f"the output (a parent reads their parameters without calling them, or the call does not use "
                    f"them, as an encoder-decoder's cross-attention in a causal LM), and ES would random-walk their "
                    f"weights; freeze them (convert(..., freeze=[...])), or run a parent that reads them through the "
                    f"exact fallback (convert(..., fallback=[...]))")

    def population_call(self, *args, unused: list[str] | None = None, **kwargs):
        """``pm(*args, **kwargs)``: the model's population call, a module found to need the exact fallback put
        there first (with a warning, see :meth:`fall_back`); ``unused`` as in :meth:`perturbing`."""
        def call():
            with self.perturbing(unused):
                return self.model(*args, **kwargs)
        if not any(layer.is_perturbing for layer in self.layers.values()):
            return self.with_fallbacks(call)
        try:  # a module made now would not be perturbing in the rest of the caller's block
            return call()
        except NeedsFallback as e:
            raise ValueError(f"{e}\n(nesgpu would put it into the exact fallback itself, but not in the middle of a "
                             f"`with pm.perturbing():` block: call pm(...) once before the block, or convert with that "
                             f"fallback)") from e

    def with_fallbacks(self, call: Callable[[], T]) -> T:
        """``call()``, again after each module it finds exact only in the fallback is put there (:meth:`fall_back`)."""
        while True:
            try:
                return call()
            except NeedsFallback as e:
                self.fall_back(e)

    def _see_rows(self, module, args, kwargs) -> None:
        """Tell every module how the call's input lays out the population rows (:func:`tell_layout`)."""
        tell_layout(self.layers.values(), self.local_directions, self.antithetic, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self.population_call(*args, **kwargs)

    def fall_back(self, error: NeedsFallback) -> None:
        """Put the module ``error`` names into the exact fallback (with a warning) and redraw the current noise,
        so that the population call can run again, exactly; ``error`` itself where that cannot be done. The
        trainer's population and ``pm(...)`` call this for you at the first population call."""
        name, current, scales = fallback_root(self.model, error.module), self.noise_range, self.scales()
        label = f"{name or 'model'} ({type(self.model.get_submodule(name)).__name__})"
        try:
            fall_back(self.model, name, self.directions)
        except ValueError as why:
            raise error from why
        self._wire()
        self.place_scales(scales, known_only=True)  # the fallback's module perturbs the same parameters
        if current is not None:
            self.draw_noise(self.step, current)
        warnings.warn(f"{label} {error.reason}; it runs through the exact torch.func fallback from now on, member "
                      f"by member (slow); convert(..., fallback=[{name!r}]) does this up front", stacklevel=3)

    def shared_input(self, x: torch.Tensor) -> torch.Tensor:
        """The population on one input x (B, ...) that every member sees: the same as calling this object
        on x repeated as rows (R, B, D) (R = 2 signs with antithetic sampling, else 1), laid out the same.

        When the model is an nn.Sequential whose first perturbed module is a Linear, reached through
        parameter-free row-wise modules (Flatten, Identity) on 2-D inputs, that Linear computes the plain
        product once per sample and never builds the repeated rows; any other model runs on the rows.
        """
        if self.noise_range is None:
            raise ValueError("no noise: call set_noise() before a population call")
        x = self._in_dtype(x)
        with self.perturbing():  # the Sequential shortcut (nesgpu.layers.sequential), else the repeated rows
            out = shared_forward(self.model, x, 2 if self.antithetic else 1)
            return self.model(self.member_rows(x)) if out is None else out

    def member_rows(self, batch: torch.Tensor) -> torch.Tensor:
        """The population rows in which every member sees all of ``batch`` (B, ...): (signs * B * D, ...),
        laid out (sign, sample, direction), signs = 2 with antithetic sampling, else 1. Row n is sample
        ``(n // D) % B`` for direction ``n % D``: prompts for ``generate()``, with their attention mask.

        Example:
            >>> with pm.perturbing():
            ...     out = model.generate(input_ids=pm.member_rows(ids), attention_mask=pm.member_rows(mask))
            >>> answers = pm.by_member(out)  # (signs, B, D, T)
        """
        signs, d = 2 if self.antithetic else 1, self.local_directions
        if not isinstance(batch, torch.Tensor) or batch.dim() < 1:
            raise TypeError(f"batch must be a tensor with samples on its first dimension; got {batch!r}")
        rows = batch.unsqueeze(0).unsqueeze(2).expand(signs, batch.shape[0], d, *batch.shape[1:])
        return rows.reshape(-1, *batch.shape[1:])

    def by_member(self, rows: torch.Tensor) -> torch.Tensor:
        """Population rows (signs * B * D, ...) as (signs, B, D, ...): the inverse of :meth:`member_rows`."""
        signs, d = 2 if self.antithetic else 1, self.local_directions
        if rows.dim() < 1 or rows.shape[0] % (signs * d):
            raise ValueError(f"rows must have a multiple of signs x directions = {signs * d} rows; got shape "
                             f"{tuple(rows.shape)}")
        return rows.view(signs, rows.shape[0] // (signs * d), d, *rows.shape[1:])

    # ----- estimator ---------------------------------------------------------------------------------
    def update(self, weights: torch.Tensor, sigma: float | None = None, *, check_finite: bool = True) -> None:
        """Add the ES gradient estimate to ``.grad`` of every perturbed parameter.

        ``weights`` (floating point) of shape (D,) gives ``g = 1/(D sigma) sum_d w_d z_d`` (S o z_d with
        :meth:`set_scales`: the noise as evaluated), ``sigma`` the scale the noise was evaluated at (default:
        :attr:`sigma`); of shape (R, D) it is first reduced to ``w_d = 1/R sum_r s_r w[r, d]``. D here is the
        number of directions the current noise covers; the scale always uses the whole population, so chunks'
        updates add up to the full one. Lower is better: ``weights = losses`` and ``optimizer.step()`` descends (a
        fitness, higher-is-better as ``tell`` takes it, is negated). ``check_finite`` (default True): a NaN or inf
        weight, which would make every ``.grad`` non-finite, is a ValueError naming the first; the check reads
        from the device, and the trainer, which refuses non-finite fitness before shaping, passes False.
        """
        device = next(iter(self.parameters())).device if getattr(weights, "is_meta", False) else None  # for the error
        weights = member_weights(weights, self.local_directions, self.antithetic, device, check_finite)
        coef = weights / (self.directions * (self.sigma if sigma is None else check_sigma(sigma)))
        for layer in self.layers.values():
            if layer.perturbs:
                masters = {name: master for name, p in layer.perturbed_parameters().items()
                           if (master := self._masters.of(p)) is not p}
                layer.accumulate_grad(coef, masters or None)
        self._masters.note_update()

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
            raise ValueError("no noise: call set_noise() first (before a population call or update())")
        return len(current)

    def __repr__(self) -> str:
        return (f"PerturbedModel(directions={self.directions}, sigma={self.sigma}, antithetic={self.antithetic}, "
                f"seed={self.seed}, step={self.step},\n  model={self.model!r})")
