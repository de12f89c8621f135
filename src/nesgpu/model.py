"""PerturbedModel: runs a whole ES population through a model in one batched forward pass."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from .layers import KINDS, PerturbedLayer
from .layers.base import repeat_signs


def direction_blocks(directions: range, size: int | None) -> list[range]:
    """``directions`` cut into consecutive blocks of at most ``size`` (one block when size is None)."""
    size = size or len(directions)
    return [range(a, min(a + size, directions.stop)) for a in range(directions.start, directions.stop, size)]


class PerturbedModel:
    """Wraps a model whose parameterised layers are perturbed layers (see :func:`convert`).

    ``model(x)`` stays the plain, unperturbed model. ``pm(x)``, or ``pm.any_method(...)``, runs the model
    in population mode (without autograd): its input is laid out as (repeats, directions, ...) and
    flattened on the leading dimension, row ``n`` evaluating ``theta + sigma * s_r * z_d`` with
    ``d = n % D`` and ``r = n // D``; ``s_r = -1`` for ``r >= R/2`` with ``antithetic=True``, else +1.

    Args:
        model: the model; it must contain at least one perturbed layer.
        directions: population size D (number of noise directions).
        sigma: noise scale.
        antithetic: evaluate each direction with both signs (the input's repeats R must be even).
        seed: noise seed. Direction d's noise depends only on (seed, step, layer, d).

    Example:
        >>> net = convert(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), "lowrank", directions=64)
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
        self.layers: dict[str, PerturbedLayer] = {
            name: m for name, m in model.named_modules() if isinstance(m, PerturbedLayer)
        }
        if not self.layers:
            raise ValueError("model has no perturbed layers; call nesgpu.convert(model, kind, directions) first")
        for name, layer in self.layers.items():
            if layer.directions not in (None, directions):
                raise ValueError(f"layer {name!r} was built for directions={layer.directions}; expected {directions}")
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
        """Drop every layer's noise (e.g. before saving); the next population call needs ``set_noise``."""
        for layer in self.layers.values():
            layer.free_memory()

    def dense_noise(self) -> dict[str, torch.Tensor]:
        """Unit-scale noise z_d of every perturbed parameter, densely: ``{"0.weight": (D, out, in), ...}``."""
        return {f"{name}.{key}" if name else key: z
                for name, layer in self.layers.items() for key, z in layer.dense_noise().items()}

    def noise_sq_norms(self) -> torch.Tensor:
        """||z_d||^2 over all perturbed parameters, per local direction: shape (D,)."""
        return sum(layer.noise_sq_norms() for layer in self.layers.values())

    @property
    def num_perturbed(self) -> int:
        """How many scalar parameters are perturbed (the dimension of z_d)."""
        return sum(p.numel() for layer in self.layers.values() for p in (layer.weight, layer.bias) if p is not None)

    # ----- population forward ------------------------------------------------------------------------
    @contextmanager
    def perturbing(self) -> Iterator[None]:
        """Inside this block, calls of the model evaluate the population."""
        with ExitStack() as stack:
            for layer in self.layers.values():
                stack.enter_context(layer.perturbing(self.sigma, self.antithetic))
            yield

    def __call__(self, *args, **kwargs):
        with self.perturbing(), torch.no_grad():
            return self.model(*args, **kwargs)

    def __getattr__(self, name: str):
        # pm.<method>(...) runs model.<method> in population mode. Only reached for names not found on pm.
        if name.startswith("_") or "model" not in self.__dict__:
            raise AttributeError(name)
        attr = getattr(self.model, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def population_call(*args, **kwargs):
            with self.perturbing(), torch.no_grad():
                return attr(*args, **kwargs)

        return population_call

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
            layer.accumulate_grad(coef)

    @property
    def noise_range(self) -> range | None:
        """The directions the current noise covers (None before set_noise or after free_memory)."""
        layer = next(iter(self.layers.values()))
        return range(*layer._range) if layer._noise is not None else None

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


def convert(model: nn.Module, kind: str = "lowrank", directions: int | None = None, **options) -> nn.Module:
    """Swap every nn.Linear / nn.Conv2d in ``model`` for the perturbed layer of ``kind``, keeping weights.

    Args:
        model: converted in place (a bare nn.Linear / nn.Conv2d is returned as a new layer).
        kind: one of ``"gaussian"``, ``"sparse"`` (Linear only), ``"permuted"``, ``"flipout"``, ``"lowrank"``.
        directions: population size (may be left to :class:`PerturbedModel`).
        **options: the kind's options, e.g. ``rank=2`` or ``in_sparsity=0.1``.

    Returns:
        the converted model. Its parameters are new objects: build the optimizer after converting.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {sorted(KINDS)}")
    linear_cls, conv_cls = KINDS[kind]

    def swap(module: nn.Module) -> nn.Module:
        if isinstance(module, PerturbedLayer):
            return module
        if isinstance(module, nn.Linear):
            args = dict(in_features=module.in_features, out_features=module.out_features)
            return _rebuild(linear_cls, module, args, directions, options)
        if isinstance(module, nn.Conv2d):
            if conv_cls is None:
                raise ValueError(f"kind {kind!r} has no Conv2d layer; for convolutions use one of "
                                 f"{sorted(k for k, (_, c) in KINDS.items() if c is not None)}")
            args = dict(in_channels=module.in_channels, out_channels=module.out_channels,
                        kernel_size=module.kernel_size, stride=module.stride, padding=module.padding,
                        dilation=module.dilation, groups=module.groups, padding_mode=module.padding_mode)
            return _rebuild(conv_cls, module, args, directions, options)
        for name, child in module.named_children():
            setattr(module, name, swap(child))
        return module

    return swap(model)


def _rebuild(cls, module, args, directions, options):
    weight = module.weight
    # Built on "meta" so that no initialisation runs (and no global RNG is consumed), then filled in.
    layer = cls(**args, bias=module.bias is not None, device="meta", dtype=weight.dtype,
                directions=directions, **options)
    layer = layer.to_empty(device=weight.device)
    layer.load_state_dict(module.state_dict())
    layer.train(module.training)
    return layer
