"""What every perturbation kind shares: noise state, the population layout, and the update.

A kind subclasses :class:`PerturbedLinearBase` or :class:`PerturbedConv2dBase` together with the torch
layer it replaces, and supplies four things:

- ``_draw_directions(generator, n)``: per-direction noise for one block of ``n`` directions;
- ``_draw_shared(generator)``: noise all directions share (optional);
- ``_add_weight_perturbation(x, y, scale, noise)``: add ``scale[r] * (x_{r,d} z_d)`` to ``y`` in place,
  reading the noise from ``noise`` (the noise in the forward's compute dtype, see ``_noise_in``);
- ``_weight_grad(coef)`` and ``_dense_weight_noise()``: ``sum_d coef_d z_d`` and the stacked ``z_d``.

Layout: a population input has ``R * D`` rows laid out as (repeats, directions); row ``n`` uses
direction ``n % D``. ``scale`` has shape (R,): ``sigma`` for each repeat, negated for the second half
of the repeats with antithetic sampling.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from ..noise import NoiseSource


def repeat_scale(repeats: int, sigma: float, antithetic: bool, like: torch.Tensor) -> torch.Tensor:
    """sigma * s_r for each repeat r: +sigma, or -sigma for r >= R/2 with antithetic sampling."""
    scale = torch.full((repeats,), float(sigma), dtype=like.dtype, device=like.device)
    if antithetic:
        scale[repeats // 2 :] = -float(sigma)
    return scale


def repeat_signs(repeats: int, antithetic: bool, device: torch.device) -> torch.Tensor:
    """s_r in {+1, -1} for each repeat r."""
    return repeat_scale(repeats, 1.0, antithetic, torch.empty(0, device=device))


def resolve_count(value: float | int | None, total: int, name: str) -> int:
    """A count in [1, total] from a fraction (float in (0, 1]) or a count (int in [1, total]); None is all."""
    if value is None:
        return total
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a fraction (float) or a count (int); got {type(value).__name__}")
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name} as a fraction must be in (0, 1]; got {value}")
        return max(1, round(value * total))
    if not 1 <= value <= total:
        raise ValueError(f"{name} as a count must be in [1, {total}]; got {value}")
    return value


class PerturbedLayer(nn.Module):
    """Noise state and the population contract shared by all perturbed layers.

    Outside a :class:`~nesgpu.PerturbedModel` call the layer is exactly its torch parent.
    """

    directions: int | None

    def _init_perturbation(self, directions: int | None) -> None:
        if directions is not None and (not isinstance(directions, int) or directions < 1):
            raise ValueError(f"directions must be a positive int; got {directions!r}")
        self.directions = directions
        self.layer_key = 0
        self._noise: dict[str, torch.Tensor] | None = None
        self._cast: tuple[torch.dtype, dict[str, torch.Tensor]] | None = None  # the noise in a compute dtype
        self._source: NoiseSource | None = None
        self._range = (0, 0)
        self._active: tuple[float, bool] | None = None  # (sigma, antithetic) during a population call
        self._scale: tuple[tuple, torch.Tensor] | None = None  # the last repeat_scale and its key

    # ----- noise -------------------------------------------------------------------------------------
    @property
    def out_size(self) -> int:
        raise NotImplementedError

    def _draw_directions(self, gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _draw_shared(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {}

    def _randn(self, *shape: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=self.weight.device, dtype=self.weight.dtype)

    def set_noise(self, seed: int, step: int, start: int = 0, stop: int | None = None) -> None:
        """Draw the noise of directions ``[start, stop)`` for ``step`` (default: all ``directions``)."""
        if self.directions is None:
            raise ValueError(f"{type(self).__name__}.directions is not set; wrap the model in PerturbedModel")
        stop = self.directions if stop is None else stop
        if not 0 <= start < stop <= self.directions:
            raise ValueError(f"direction range must lie in [0, {self.directions}]; got [{start}, {stop})")
        device = self.weight.device
        src = self._source
        if src is None or src.seed != seed or src.layer != self.layer_key or src.generator.device != device:
            src = self._source = NoiseSource(seed, self.layer_key, device)

        def draw(gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
            out = self._draw_directions(gen, n)
            if self.bias is not None:
                out["bias"] = self._randn(n, self.out_size, gen=gen)
            return out

        self._noise = self._cast = None  # free the old noise before drawing the new
        noise = self._draw_shared(src.shared(step))
        noise.update(src.per_direction(step, start, stop, draw))
        self._noise = noise
        self._range = (start, stop)

    def free_memory(self) -> None:
        """Drop the noise tensors. The next population call needs a new ``set_noise``."""
        self._noise = self._cast = None

    @property
    def local_directions(self) -> int:
        """How many directions the current noise covers (the whole population unless chunked)."""
        return self._range[1] - self._range[0]

    def _require_noise(self) -> dict[str, torch.Tensor]:
        if self._noise is None:
            raise ValueError(f"{type(self).__name__} has no noise: call set_noise() before a population forward")
        return self._noise

    def _noise_in(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The noise with its floating tensors in ``dtype``, the population forward's compute dtype.

        Under autocast the base GEMM returns bf16/fp16; the perturbation then runs in that dtype too
        instead of promoting every product to fp32. The cast is made once per ``set_noise`` and kept, so
        an RL rollout's hundreds of forwards pay for it once. The update always uses the fp32 noise.
        Like the noise, sigma is then rounded to that dtype (by at most 2**-9 of itself in bf16): the
        population sees sigma * (1 + eps) while the update divides by sigma, a bias far below ES's noise.
        """
        noise = self._require_noise()
        if all(t.dtype == dtype or not t.is_floating_point() for t in noise.values()):
            return noise
        if self._cast is None or self._cast[0] != dtype:
            self._cast = (dtype, {k: t.to(dtype) if t.is_floating_point() else t for k, t in noise.items()})
        return self._cast[1]

    def _repeat_scale(self, repeats: int, like: torch.Tensor) -> torch.Tensor:
        """``repeat_scale`` for this call, kept while repeats, sigma, dtype and device stay the same (an RL
        rollout calls the layer hundreds of times per step with the same ones). Read-only."""
        key = (repeats, *self._active, like.dtype, like.device)
        if self._scale is None or self._scale[0] != key:
            self._scale = (key, repeat_scale(repeats, *self._active, like))
        return self._scale[1]

    @contextmanager
    def perturbing(self, sigma: float, antithetic: bool):
        """Within this block, ``forward`` evaluates the population."""
        self._active = (float(sigma), bool(antithetic))
        try:
            yield self
        finally:
            self._active = None

    def _population_shape(self, rows: int, what: str) -> tuple[int, int]:
        d = self.local_directions
        self._require_noise()
        if rows % d:
            raise ValueError(
                f"{type(self).__name__}: input has {rows} {what}; expected a multiple of directions={d} "
                f"laid out as (repeats, directions, ...)"
            )
        r = rows // d
        if self._active[1] and r % 2:
            raise ValueError(
                f"{type(self).__name__}: antithetic sampling needs an even number of repeats; input has "
                f"{rows} {what} = {r} repeats x {d} directions"
            )
        return r, d

    # ----- estimator ---------------------------------------------------------------------------------
    def _weight_grad(self, coef: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _dense_weight_noise(self) -> torch.Tensor:
        raise NotImplementedError

    def accumulate_grad(self, coef: torch.Tensor) -> None:
        """Add ``sum_d coef_d z_d`` to ``.grad`` of the weight and the bias (created if None)."""
        noise = self._require_noise()
        coef = coef.to(device=self.weight.device, dtype=self.weight.dtype)
        if coef.shape != (self.local_directions,):
            raise ValueError(f"coef must have shape ({self.local_directions},); got {tuple(coef.shape)}")
        grads = [(self.weight, self._weight_grad(coef))]
        if self.bias is not None:
            grads.append((self.bias, coef @ noise["bias"]))
        for p, g in grads:
            if p.grad is None:  # _weight_grad returns a fresh tensor, so it can become .grad as is
                p.grad = g.reshape(p.shape)
            else:
                p.grad.add_(g.reshape(p.shape))

    def _weight_sq_norms(self) -> torch.Tensor:
        raise NotImplementedError

    def noise_sq_norms(self) -> torch.Tensor:
        """||z_d||^2 over the weight and bias of each local direction, shape (D,), without densifying."""
        noise = self._require_noise()
        sq = self._weight_sq_norms()
        if self.bias is not None:
            sq = sq + noise["bias"].pow(2).sum(1)
        return sq

    def dense_noise(self) -> dict[str, torch.Tensor]:
        """The unit-scale noise z_d of every local direction as dense tensors, for tests and inspection.

        Returns ``{"weight": (D, *weight.shape), "bias": (D, out)}`` (no "bias" without a bias).
        """
        noise = self._require_noise()
        out = {"weight": self._dense_weight_noise()}
        if self.bias is not None:
            out["bias"] = noise["bias"]
        return out

    def _options_repr(self) -> str:
        return ""

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, directions={self.directions}{self._options_repr()}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._active is None:
            return super().forward(x)
        return self._population_forward(x)


class PerturbedLinearBase(PerturbedLayer):
    """Population forward of Linear kinds: all leading dimensions are flattened into rows."""

    @property
    def out_size(self) -> int:
        return self.out_features

    # (out, in total, groups, kernel): the geometry the shared-noise kinds are written against
    @property
    def geometry(self) -> tuple[int, int, int, tuple[int, ...]]:
        return self.out_features, self.in_features, 1, ()

    def _apply_shared(self, x: torch.Tensor, weight: torch.Tensor, groups: int = 1) -> torch.Tensor:
        """x (R, D, in) times a shared weight (k, in) -> (R, D, k)."""
        return F.linear(x, weight)

    def _population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"{type(self).__name__}: expected input of shape (repeats * directions, ..., {self.in_features}); "
                f"got {tuple(x.shape)}"
            )
        rows = x.numel() // self.in_features
        r, d = self._population_shape(rows, "rows")
        y = F.linear(x, self.weight, self.bias)
        noise = self._noise_in(y.dtype)  # y is bf16/fp16 under autocast: perturb in that dtype
        scale = self._repeat_scale(r, y)
        y3 = y.view(r, d, self.out_features)
        self._add_weight_perturbation(x.to(y.dtype).reshape(r, d, self.in_features), y3, scale, noise)
        if self.bias is not None:
            y3.addcmul_(noise["bias"].unsqueeze(0), scale.view(r, 1, 1))
        return y


class PerturbedConv2dBase(PerturbedLayer):
    """Population forward of Conv2d kinds: input (repeats * directions, C, H, W)."""

    @property
    def out_size(self) -> int:
        return self.out_channels

    @property
    def geometry(self) -> tuple[int, int, int, tuple[int, ...]]:
        return self.out_channels, self.in_channels, self.groups, tuple(self.kernel_size)

    def _apply_shared(self, x: torch.Tensor, weight: torch.Tensor, groups: int = 1) -> torch.Tensor:
        """x (R, D, C, H, W) convolved with a shared kernel (k, C / groups, kh, kw) -> (R, D, k, H', W')."""
        r, d = x.shape[:2]
        out = self._conv(x.reshape(r * d, *x.shape[2:]), weight, groups)
        return out.view(r, d, *out.shape[1:])

    def _conv(self, x: torch.Tensor, weight: torch.Tensor, groups: int | None = None) -> torch.Tensor:
        """Convolve with this layer's geometry (stride, padding, padding_mode, dilation)."""
        groups = self.groups if groups is None else groups
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(x, weight, None, self.stride, 0, self.dilation, groups)
        return F.conv2d(x, weight, None, self.stride, self.padding, self.dilation, groups)

    def _population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"{type(self).__name__}: expected input of shape (repeats * directions, {self.in_channels}, H, W); "
                f"got {tuple(x.shape)}"
            )
        r, d = self._population_shape(x.shape[0], "rows")
        y = self._conv_forward(x, self.weight, self.bias)
        noise = self._noise_in(y.dtype)
        scale = self._repeat_scale(r, y)
        y5 = y.view(r, d, *y.shape[1:])
        self._add_weight_perturbation(x.to(y.dtype).reshape(r, d, *x.shape[1:]), y5, scale, noise)
        if self.bias is not None:
            y5.addcmul_(noise["bias"].view(1, d, -1, 1, 1), scale.view(r, 1, 1, 1, 1))
        return y
