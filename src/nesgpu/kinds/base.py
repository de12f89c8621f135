"""The noise record and the interface every perturbation kind implements.

A kind is a small frozen dataclass of options (``LowRank(rank=2)``) whose methods are plain functions of
a :class:`Noise` record: draw, apply (the population product), grad (the estimator), dense z_d, squared
norms. It holds no state: the record carries the drawn tensors, the layer carries the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch

from .ops import LINEAR, Geometry, Op


def randn(like: torch.Tensor, *shape: int, gen: torch.Generator) -> torch.Tensor:
    """Unit Gaussians of ``shape`` on ``like``'s device and dtype, from ``gen``."""
    return torch.randn(*shape, generator=gen, device=like.device, dtype=like.dtype)


@dataclass
class Noise:
    """The noise of one parameter for ``directions`` consecutive directions of one step.

    Args:
        geometry: the parameter as a matrix (None for parameters perturbed elementwise, e.g. vectors).
        shape: the parameter's shape.
        tensors: what the kind drew: per-direction tensors have ``directions`` rows first; shared ones
            (used by every direction) do not.
        directions: how many directions this record covers.
    """

    geometry: Geometry | None
    shape: tuple[int, ...]
    tensors: dict[str, torch.Tensor]
    directions: int
    _cast: dict = field(default_factory=dict, repr=False)
    _derived: dict = field(default_factory=dict, repr=False)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def to(self, dtype: torch.dtype) -> Noise:
        """The record with floating tensors in ``dtype`` (the forward's compute dtype under autocast).

        Made once per dtype and kept, so an RL rollout's hundreds of forwards cast once. The update always
        uses the record as drawn (fp32)."""
        if all(t.dtype == dtype or not t.is_floating_point() for t in self.tensors.values()):
            return self
        if dtype not in self._cast:
            tensors = {k: t.to(dtype) if t.is_floating_point() else t for k, t in self.tensors.items()}
            self._cast[dtype] = Noise(self.geometry, self.shape, tensors, self.directions)
        return self._cast[dtype]

    def derived(self, name: str, sources: tuple, fn: Callable[[], object]) -> object:
        """``fn()``, kept with this record while ``sources`` (tensors, or None) are the same objects at the same
        version: work that depends only on the step's noise (and, say, sigma) is done once per step, not once
        per forward (a decode step's). Compiled code computes it inline (the graph fuses it)."""
        if torch.compiler.is_compiling():
            return fn()
        kept = self._derived.get(name)
        if kept is not None and len(kept[0]) == len(sources):
            for t, (held, version) in zip(sources, kept[0]):
                if t is not held or (t is not None and t._version != version):
                    break
            else:
                return kept[1]
        value = fn()
        self._derived[name] = (tuple((t, None if t is None else t._version) for t in sources), value)
        return value


@dataclass(frozen=True)
class Kind:
    """A perturbation kind: how direction d's unit-scale noise z_d is drawn and applied.

    Every entry of z_d has mean 0 and variance 1. ``apply_`` adds ``scale_r * (x * z_d)`` for the
    product the op defines; ``grad`` returns ``sum_d coef_d z_d``; ``dense`` the stacked z_d.
    """

    name: ClassVar[str]
    products: ClassVar[frozenset[str]] = frozenset({"linear", "conv"})
    needs_antithetic: ClassVar[bool] = False  # a kind whose z_d has a non-zero mean within one step
    per_element_scale: ClassVar[bool] = False  # whether its z_d can carry a scale per entry (a sigma per parameter)
    # whether its z_d on a plain matrix can carry a scale S = row x column (an outer product; low-rank noise)
    outer_scale: ClassVar[bool] = False

    def supports(self, product: str) -> bool:
        """Whether this kind implements ``product`` ("linear", "conv" or "embedding")."""
        return product in self.products

    def check(self, geometry: Geometry) -> None:
        """Raise ValueError if this kind's options do not fit a parameter of this geometry."""

    def check_model(self, geometries: dict[str, Geometry]) -> None:
        """Raise ValueError if this kind's options fit none of a model's matrices (name -> geometry) that
        take it: an option no layer can use (a low rank above every matrix's)."""

    def draw_shared(self, gen: torch.Generator, geometry: Geometry, like: torch.Tensor) -> dict[str, torch.Tensor]:
        """Noise every direction of a step shares (none by default)."""
        return {}

    def draw_directions(self, gen: torch.Generator, n: int, geometry: Geometry,
                        like: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-direction noise of ``n`` directions: tensors with ``n`` rows first."""
        raise NotImplementedError

    def allocate_directions(self, n: int, geometry: Geometry, like: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Empty tensors for ``n`` directions' noise that :meth:`fill_directions` writes in place, or None if
        this kind only draws fresh tensors (then a block is drawn and copied into place)."""
        return None

    def fill_directions(self, gen: torch.Generator, out: dict[str, torch.Tensor], geometry: Geometry) -> None:
        """Write one block of directions' noise into ``out`` (slices of :meth:`allocate_directions`'
        tensors), consuming ``gen`` exactly as :meth:`draw_directions` does, so the values are the same."""
        raise NotImplementedError

    def apply_(self, op: Op, x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, noise: Noise) -> None:
        """y (R, D, ...) += scale_r * (x_{r,d} times z_d), the product ``op`` defines."""
        raise NotImplementedError

    def apply_with_bias_(self, op: Op, x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, noise: Noise,
                         bias: torch.Tensor | None) -> None:
        """``apply_``, plus ``scale_r * bias_d`` on the channels for a bias's noise (D, out) when given. A kind
        may fold the bias into its own product to save a pass over y."""
        self.apply_(op, x, y, scale, noise)
        if bias is not None:
            y.addcmul_(op.per_channel(bias, y), op.per_repeat(scale, y))

    def linear_product(self, x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None, signed: torch.Tensor,
                       noise: Noise, bias_z: torch.Tensor | None) -> torch.Tensor | None:
        """The whole perturbed linear product, x (R, D, M, in) @ weight_t (in, out) + bias + the noise's
        product (and ``scale_r * bias_z_d``), as (R, D, M, out), where the kind can do it in one fused GEMM;
        None (the default) where it cannot: the layer then runs ``apply_with_bias_`` on the shared product.
        ``signed`` (S,) is sigma times each sign: repeat r's scale is ``signed[r // (R / S)]``."""
        return None

    def linear_plan(self, signed: torch.Tensor, noise: Noise,
                    bias_z: torch.Tensor | None) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None],
                                                             torch.Tensor] | None:
        """:meth:`linear_product` with its arguments that stay fixed for a population call bound, as a function
        ``f(x, weight_t, bias)`` (the weights are passed at every call, so changes to them are seen), where the
        kind has a fused product; None (the default) where it has not, or while compiling. A layer calls it once
        per input shape and call, then ``f`` per forward: the same values as :meth:`linear_product`, bit for bit,
        without its per-call lookups."""
        return None

    def apply_shared_(self, x: torch.Tensor, y: torch.Tensor, noise: Noise) -> None:
        """y (B, D, out) += x_b times z_d for a 2-D input x (B, in) that every direction shares (a linear
        product at unit scale). The default expands x over the directions (no copy) and runs ``apply_``; a
        kind with a cheaper form for a shared input overrides it."""
        b, d = y.shape[0], y.shape[1]
        x4 = x.view(b, 1, 1, x.shape[-1]).expand(b, d, 1, x.shape[-1])
        self.apply_(LINEAR, x4, y.view(b, d, 1, y.shape[-1]), torch.ones(b, dtype=y.dtype, device=y.device), noise)

    def embed_(self, index: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, noise: Noise) -> None:
        """y (R, D, M, dim) += scale_r * z_d[index_{r,d}] for an embedding table z_d of shape (num, dim)."""
        raise NotImplementedError(f"kind {self.name!r} has no embedding product")

    def experts_(self, x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, direction: torch.Tensor, noise: Noise,
                 expert: int) -> None:
        """y (M, out) += scale_m * (x_m times z_{direction_m}[expert]) for M tokens routed to one expert of a
        bank of matrices (geometry: ``groups`` experts of (out/groups, in)); ``direction`` and ``scale`` (M,)
        give each token's direction and signed sigma."""
        raise NotImplementedError(f"kind {self.name!r} has no experts product")

    def zero_rows_(self, noise: Noise, row: int) -> None:
        """Make row ``row`` of every z_d zero (an embedding's padding row), for kinds with an embedding
        product."""
        raise NotImplementedError(f"kind {self.name!r} has no embedding product")

    def grad(self, noise: Noise, coef: torch.Tensor) -> torch.Tensor:
        """sum_d coef_d z_d, in the parameter's shape."""
        raise NotImplementedError

    def grad_rows(self, noise: Noise, coef: torch.Tensor, rows: slice) -> torch.Tensor | None:
        """Rows ``rows`` of :meth:`grad` of a matrix, computed without the rest; None where this kind has no cheaper
        way than the whole (the caller then takes :meth:`grad`)."""
        return None

    def dense(self, noise: Noise) -> torch.Tensor:
        """z_d of every direction, (D, *shape)."""
        raise NotImplementedError

    def sq_norms(self, noise: Noise) -> torch.Tensor:
        """||z_d||^2 per direction, (D,), without densifying."""
        raise NotImplementedError

    def scale_(self, noise: Noise, scale: torch.Tensor) -> None:
        """Multiply every direction's noise by ``scale`` (of the noise's shape, > 0) in place, entry by entry: the
        record then holds S o z_d, which every product, ``grad``, ``dense`` and ``sq_norms`` read as they are.
        Only for kinds with :attr:`per_element_scale`, or :attr:`outer_scale` on a plain matrix (S an outer
        product)."""
        raise NotImplementedError(f"kind {self.name!r} cannot carry a scale per entry")

    def scale_statistic(self, noise: Noise, scale: torch.Tensor | None, weights: torch.Tensor,
                        first: bool = False) -> torch.Tensor:
        """sum_d w_d (u_d o u_d - 1) in the noise's shape (``first``: sum_d w_d u_d), u_d = z_d / S the unit noise
        of a record that :meth:`scale_` scaled by ``scale`` (None: S = 1); ``weights`` (D,) in the noise's dtype
        and device. Only for kinds with :attr:`per_element_scale`."""
        raise NotImplementedError(f"kind {self.name!r} cannot carry a scale per entry")

    def __str__(self) -> str:
        return self.name
