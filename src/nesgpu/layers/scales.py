"""A sigma per entry of a perturbed parameter (SNES, separable CMA-ES): its scale S, applied to the noise as it is
drawn, and the statistic that adapts it.

With scales, member (r, d) evaluates ``theta + sigma * s_r * (S o z_d)``, z_d the unit noise of direction d (its
random stream is the same with or without scales). A parameter without a scale has S = 1 and stores nothing.

Where S is applied: the kind multiplies the noise by S in place right after it is drawn (``Kind.scale_``, once
per ``set_noise`` and block of directions), so the noise record holds S o z_d. Every reader of the noise (the
kinds' products, ``embed_``, ``experts_``, biases and norm scales added by the layers, the exact fallback, the
update, ``dense_noise``) then evaluates S o z_d unchanged: no extra memory, and one elementwise pass per draw,
cheaper than the draw itself. Keeping the unit z and scaling at each use would cost a (D, numel) temporary in
every forward (a per-direction product cannot take S outside the product) and a change at every reader. Only the
adaptation's statistic needs the unit z: it divides S out again, one block of directions at a time
(:func:`nesgpu.kinds.gaussian.weighted_squares`). ``noise_sq_norms`` is then ||S o z_d||^2, the noise as evaluated.

Scales are kept in the noise's dtype: float32 for a half-precision parameter, else the parameter's dtype (float32
or float64), on the parameter's device, in the parameter's own layout (a Conv1D's (in, out), an expert bank's).
"""

from __future__ import annotations

import torch

from ..kinds import Noise
from .model_distribution import SCALES, ModelDistribution
from .drawing import HALF
from .layout import check_weights, repeat_scale


def full_name(layer: str, attr: str) -> str:
    """A perturbed parameter's name in the model, as ``PerturbedModel.dense_noise`` keys it."""
    return f"{layer}.{attr}" if layer else attr


OUTER_RTOL = 1e-3
"""How far (relative) a scale for an outer-product kind may be from row x column before it is refused; within
it, the scale is replaced by the outer product of its first column and row (a strategy's multiplicative updates
drift from it by rounding only)."""

# the largest scale taken, as for sigma (nesgpu.model.MAX_SIGMA): the noise sigma * scale stays within float32's
# range, and a scale past it is a diverged strategy or a damaged checkpoint, never a model's
MAX_SCALE = 1e18


def takes_scale(slot) -> bool:
    """Whether a perturbed parameter (a layer's slot) can carry a sigma per entry: kind "gaussian" always,
    low-rank noise on a plain matrix as an outer product row x column."""
    matrix = slot.geometry is not None and slot.geometry.is_matrix
    return slot.kind.per_element_scale or (slot.kind.outer_scale and matrix)


def check_scale(name: str, value, p: torch.Tensor, slot) -> torch.Tensor:
    """``value`` as the scale of parameter ``name`` (``p``, perturbed as ``slot`` says): a copy in the noise's dtype
    on ``p``'s device, contiguous; else a TypeError or ValueError naming the parameter, what it expects and what it
    got."""
    kind = slot.kind
    if not takes_scale(slot):
        where = " on a plain matrix only" if kind.outer_scale else ""
        raise ValueError(f"scales[{name!r}]: the parameter has kind {kind.name!r}, which cannot carry a sigma per "
                         f"element{where}; use layer 'gaussian' for it (convert(model, 'gaussian'))")
    shape = tuple(p.shape)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        got = f"dtype {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"scales[{name!r}] must be a floating-point torch.Tensor of the parameter's shape {shape}; "
                        f"got {got}")
    if tuple(value.shape) != shape:
        raise ValueError(f"scales[{name!r}] must have the parameter's shape {shape}; got {tuple(value.shape)}")
    if value.is_meta:
        raise ValueError(f"scales[{name!r}] must hold values; got a tensor on the meta device")
    dtype = torch.float32 if p.dtype in HALF else p.dtype
    scale = value.detach().to(device=p.device, dtype=dtype, memory_format=torch.contiguous_format, copy=True)
    good = (scale > 0) & (scale <= MAX_SCALE)  # NaN fails both
    if not bool(good.all()):  # one host read per scale: set_scales runs once per step at most
        index = tuple((~good).nonzero()[0].tolist())
        raise ValueError(f"scales[{name!r}] must be in (0, {MAX_SCALE:g}] everywhere (in {dtype}); got "
                         f"{scale[index].item()} at [{', '.join(map(str, index))}]")
    return scale if kind.per_element_scale else outer_scale(name, scale, kind)


def outer_scale(name: str, scale: torch.Tensor, kind) -> torch.Tensor:
    """``scale`` as the outer product of its first column and row (what an outer-product kind evaluates), or a
    ValueError if it is not one (within :data:`OUTER_RTOL`)."""
    outer = torch.outer(scale[:, 0], scale[0] / scale[0, 0])
    if not torch.allclose(outer, scale, rtol=OUTER_RTOL, atol=0):
        raise ValueError(f"scales[{name!r}]: kind {kind.name!r} takes a scale that is an outer product, S[i, j] = "
                         f"row[i] * col[j] (it keeps the noise low-rank); got one that is not")
    return outer


def statistic_weights(weights, directions: int, antithetic: bool, device: torch.device | None) -> torch.Tensor:
    """The weights of :meth:`ModelScales.scale_statistics`, checked as the update's (:func:`member_weights`, without
    the host read of the finiteness check) and reduced to (D,): ``w_d = sum_r w[r, d]``, without the repeats' signs
    (both members of an antithetic pair evaluate the same z_d o z_d) and without the update's 1/R."""
    check_weights(weights, directions, antithetic, device, check_finite=False)
    return weights.sum(0) if weights.dim() == 2 else weights


def signed_weights(weights: torch.Tensor, antithetic: bool) -> torch.Tensor:
    """Weights laid out as the update's, (D,) or (R, D), reduced to (D,) as ``w_d = sum_r s_r w[r, d]``: each
    member's weight with its sign, without the update's 1/R (already checked by :func:`member_weights`)."""
    if weights.dim() != 2:
        return weights
    signs = repeat_scale(weights.shape[0], 1.0, antithetic, weights)  # +-1, exact in the weights' dtype
    return (signs.view(-1, 1) * weights).sum(0)


class ScaledNoise:
    """Mixin of :class:`nesgpu.layers.base.PerturbedModule`: the scales of its perturbed parameters, by attribute
    name, multiplied into their noise when it is drawn (``set_noise`` calls :meth:`apply_scales`)."""

    def noise_scales(self) -> dict[str, torch.Tensor]:
        """The scales of this module's perturbed parameters that have one (the tensors themselves)."""
        held = self.perturbation.scales
        return {slot.name: held[slot.name] for slot in self.perturbation.slots if slot.name in held}

    def set_noise_scales(self, scales: dict[str, torch.Tensor]) -> None:
        """Replace every scale by ``scales`` (checked by :func:`check_scale`; a parameter without one has S = 1).
        The noise drawn before keeps the old ones: draw it again (``PerturbedModel.set_scales`` does)."""
        self.perturbation.scales = dict(scales)

    def apply_scales(self, noise: dict[str, Noise]) -> dict[str, Noise]:
        """``noise`` just drawn, with S o z_d in place of z_d for every parameter with a scale (``set_noise``)."""
        for name, scale in self.noise_scales().items():
            self.slot_of(name).kind.scale_(noise[name], self._scale_as_noise(name, scale, noise[name]))
        return noise

    def _scale_as_noise(self, name: str, scale: torch.Tensor, noise: Noise) -> torch.Tensor:
        """``scale`` (the parameter's layout) in the layout, dtype and device of its noise: a matrix stored
        transposed (Conv1D) transposed back, a bank of matrices as the one (out, in) matrix its noise is drawn for."""
        like = next(iter(noise.tensors.values()))
        shape = tuple(noise["z"].shape[1:]) if "z" in noise else tuple(noise.geometry.shape)
        if name in self.perturbation.transposed:
            scale = scale.transpose(-2, -1)
        if tuple(scale.shape) != shape:
            scale = scale.reshape(shape)
        return scale.to(device=like.device, dtype=like.dtype)

    def noise_scale_statistics(self, weights: torch.Tensor, first: bool = False) -> dict[str, torch.Tensor]:
        """``sum_d w_d (z_d o z_d - 1)`` (``first``: ``sum_d w_d z_d``) of the unit noise z_d, over the current
        noise's directions, for every perturbed parameter whose kind takes a scale, in the parameter's layout;
        ``weights`` (D,)."""
        noise = self.require_noise()
        if weights.shape != (self.local_directions,):
            raise ValueError(f"weights must have shape ({self.local_directions},); got {tuple(weights.shape)}")
        held, out = self.noise_scales(), {}
        for slot in self.perturbation.slots:
            if not takes_scale(slot):
                continue
            record = noise[slot.name]
            scale = held.get(slot.name)
            scale = None if scale is None else self._scale_as_noise(slot.name, scale, record)
            like = next(iter(record.tensors.values()))
            w = weights.to(device=like.device, dtype=like.dtype)
            stat = slot.kind.scale_statistic(record, scale, w, first)
            out[slot.name] = self.as_stored(slot.name, stat.unsqueeze(0))[0].contiguous()
        return out


class ModelScales(ModelDistribution):
    """Mixin of :class:`nesgpu.PerturbedModel`: a sigma per entry of its perturbed parameters (see the module
    docstring). Uses the model's ``layers``, ``seed``, ``step``, ``antithetic``, ``local_directions``,
    ``parameters()``, ``check_distribution()`` and ``redraw_noise()``."""

    def set_scales(self, scales: dict[str, torch.Tensor] | None) -> None:
        """Set the scale S of perturbed parameters: ``{"2.weight": S, ...}`` keyed as :meth:`dense_noise`, each
        of its parameter's shape, floating point, finite and > 0; member (r, d) then evaluates
        ``theta + sigma * s_r * (S o z_d)``. It replaces every scale: a parameter without an entry has S = 1, and
        ``None`` removes them all. Only parameters of kind "gaussian" take a scale (matrices converted with
        layer "gaussian"; biases and norm scales under any layer). Each is copied in float32, or in the
        parameter's dtype where that is wider, onto the parameter's device. Scales persist across ``set_noise``
        (they are not noise) and do not change the random stream of z_d; the current noise, if any, is drawn
        again (same step and directions) so that it holds the new S (``free_memory()`` first skips that draw).
        Bad input (an unknown name, a kind that takes no scale, a wrong type or shape, a value that is not
        finite or not > 0) is a ValueError or TypeError naming the parameter; nothing is changed then."""
        if scales:
            self.check_distribution(SCALES)
        before = bool(self.scales())
        self.place_scales(scales)
        if before or self.scales():
            self.redraw_noise()

    def place_scales(self, scales: dict[str, torch.Tensor] | None, known_only: bool = False) -> None:
        """Check every entry of ``scales`` and give each module its own (all or none); ``known_only``: entries of
        parameters the model no longer perturbs are dropped (a module just put into the exact fallback)."""
        if scales is not None and not isinstance(scales, dict):
            raise TypeError(f"scales must be a dict of parameter name -> tensor, or None; got {type(scales).__name__}")
        slots = {full_name(name, slot.name): (name, slot) for name, layer in self.layers.items()
                 for slot in layer.slots}
        placed: dict[str, dict[str, torch.Tensor]] = {name: {} for name in self.layers}
        for key, value in (scales or {}).items():
            if key not in slots:
                if known_only:
                    continue
                raise ValueError(f"scales: {key!r} is not a perturbed parameter of the model; expected one of "
                                 f"{sorted(slots)[:10]}{' ...' if len(slots) > 10 else ''}")
            name, slot = slots[key]
            placed[name][slot.name] = check_scale(key, value, self.layers[name].get_parameter(slot.name), slot)
        for name, layer in self.layers.items():
            layer.set_noise_scales(placed[name])

    def unit_scales(self) -> dict[str, torch.Tensor]:
        """S = 1 for every perturbed parameter whose kind takes a scale, in the dtype :meth:`set_scales` keeps:
        where a strategy that adapts them starts."""
        return {full_name(name, slot.name): torch.ones_like(p, dtype=torch.float32 if p.dtype in HALF else p.dtype)
                for name, layer in self.layers.items() for slot in layer.slots if takes_scale(slot)
                for p in [layer.get_parameter(slot.name)]}

    def check_scalable(self, strategy: str, outer: bool) -> None:
        """Raise a ValueError naming the first perturbed parameter that cannot carry a sigma per entry, for
        ``strategy`` (which adapts one for every parameter; ``outer``: its updates keep an outer product one)."""
        for name, layer in self.layers.items():
            for slot in layer.slots:
                if not takes_scale(slot) or not (outer or slot.kind.per_element_scale):
                    raise ValueError(f"{strategy} adapts a sigma per parameter; {full_name(name, slot.name)} (kind "
                                     f"{slot.kind.name!r} on a {type(layer).__name__}) cannot carry one: use "
                                     f"--layer gaussian")

    def assign_scales_(self, values: dict[str, torch.Tensor]) -> None:
        """Copy ``values`` into the current scales, in place and unchecked (no host read): a strategy's new
        scales each step, from statistics of finite fitness. Every name must have a scale already
        (:meth:`set_scales`); the noise held keeps the old S until it is drawn again."""
        held = self.scales()
        missing = sorted(set(values) - set(held))
        if missing:
            raise ValueError(f"assign_scales_: {missing[0]!r} has no scale yet; set one first with set_scales")
        for name, value in values.items():
            held[name].copy_(value)

    def scales(self) -> dict[str, torch.Tensor]:
        """The current scales by parameter name (the tensors themselves: change them through :meth:`set_scales`);
        parameters with S = 1 have no entry."""
        return {full_name(name, attr): scale for name, layer in self.layers.items()
                for attr, scale in layer.noise_scales().items()}

    def scale_statistics(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """The statistic that adapts the scales, for every perturbed parameter of kind "gaussian":
        ``sum_d w_d (z_d o z_d - 1)`` over the current noise's directions, z_d the unit noise (before S).

        ``weights`` are laid out as :meth:`update`'s: (D,), or (R, D) reduced to ``w_d = sum_r w[r, d]``. The
        repeats' signs are not applied (both members of an antithetic pair evaluate the same z_d o z_d, so each
        member's weight counts once) and, unlike the update, there is no 1/R, no 1/D and no 1/sigma: the caller
        scales it. Chunks' statistics (the same step, disjoint direction ranges) add up to the whole
        population's. The tensors are in the noise's dtype (see :meth:`set_scales`), in the parameter's shape, on
        its device; no host read (non-finite weights give non-finite statistics, which :meth:`set_scales`
        refuses) and no (D, numel) temporary beyond the noise itself."""
        device = next(iter(self.parameters())).device if getattr(weights, "is_meta", False) else None  # for the error
        w = statistic_weights(weights, self.local_directions, self.antithetic, device)
        return {full_name(name, attr): stat for name, layer in self.layers.items() if layer.perturbs
                for attr, stat in layer.noise_scale_statistics(w).items()}

    def scale_means(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """``sum_d w_d z_d`` of the unit noise z_d (before S), for every perturbed parameter of kind "gaussian":
        the weighted step of the members in the units of their own distribution (CMA-ES's evolution path).
        ``weights`` (D,), or (R, D) reduced to ``w_d = sum_r s_r w[r, d]`` (each member's weight with its
        sign, no 1/R). Chunks add up; no host read."""
        device = next(iter(self.parameters())).device if getattr(weights, "is_meta", False) else None  # for the error
        check_weights(weights, self.local_directions, self.antithetic, device, check_finite=False)
        w = signed_weights(weights, self.antithetic)
        return {full_name(name, attr): stat for name, layer in self.layers.items() if layer.perturbs
                for attr, stat in layer.noise_scale_statistics(w, first=True).items()}
