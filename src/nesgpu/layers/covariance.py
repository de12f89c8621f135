"""A full covariance over every perturbed entry of the model (CMA-ES): member (r, d) evaluates
``theta + sigma * s_r * (A z_d)``, z_d the unit noise of all perturbed parameters read as one vector of n entries
and A an (n, n) factor of the covariance C = A A^T.

Where A is applied: once every module has drawn its noise for a block of directions
(:meth:`ModelCovariance.draw_noise`), the noise of all perturbed parameters is read as one (D, n) matrix Z and
Y = Z A^T is written back into the modules' noise records. Every reader of the noise (the products, the update,
``dense_noise``) then evaluates the correlated y_d = A z_d unchanged. The unit Z is kept beside it for the
adaptation's statistics (as much memory as the noise itself). Cost: D n^2 per draw and n^2 entries for A, so this
is meant for small models (CMA-ES caps n at :data:`nesgpu.strategies.cma_es.MAX_PARAMETERS`).

Order of the n entries: the perturbed modules in :attr:`PerturbedModel.layers` order, each module's parameters
in its own order, each flattened in its noise's layout (a Conv1D's weight as (out, in)). Only kind "gaussian"
takes a covariance (its noise is a dense tensor per direction), and a model has either scales or a covariance.
"""

from __future__ import annotations

import torch

from .model_distribution import COVARIANCE
from .layout import check_weights
from .scales import full_name, signed_weights, statistic_weights
from .subspace import ModelSubspace


class ModelCovariance(ModelSubspace):
    """Mixin of :class:`nesgpu.PerturbedModel`: a covariance over all its perturbed entries (see the module
    docstring), and the drawing of the model's noise (zero outside a step's subspace: :mod:`.subspace`). Uses the
    model's ``layers``, ``seed``, ``step``, ``antithetic``, ``local_directions``, ``noise_range`` and
    ``check_distribution()``."""

    def covariance_entries(self) -> tuple[tuple[str, int], ...]:
        """(parameter name, entries) of every perturbed parameter, in the order of A's rows; a ValueError names
        the first one whose kind cannot take a covariance."""
        entries = []
        for name, layer in self.layers.items():
            for slot in layer.slots:
                key = full_name(name, slot.name)
                if not slot.kind.per_element_scale:
                    raise ValueError(f"a covariance needs every perturbed parameter of kind 'gaussian'; {key!r} has "
                                     f"kind {slot.kind.name!r} (convert(model, 'gaussian'), --layer gaussian)")
                entries.append((key, layer.get_parameter(slot.name).numel()))
            if layer.perturbed_numel() != sum(layer.get_parameter(slot.name).numel() for slot in layer.slots):
                raise ValueError(f"{name or 'the model'} ({type(layer).__name__}) has entries that are never "
                                 f"perturbed (an embedding's padding row), which a covariance would mix into the "
                                 f"others; use a sigma per parameter (sep_cma_es, snes) for it")
        return tuple(entries)

    def set_covariance(self, factor: torch.Tensor | None) -> None:
        """Set A (member noise A z_d, covariance A A^T): an (n, n) floating tensor, finite, n the perturbed
        entries (:meth:`covariance_entries`); ``None`` removes it. It is copied in float32, or float64 where a
        parameter is, onto the parameters' device; the current noise, if any, is drawn again with it."""
        if factor is None:
            self.__dict__["_covariance"] = None
        else:
            self.__dict__["_covariance"] = self._checked_factor(factor)
        self.redraw_noise()

    def _checked_factor(self, factor) -> dict:
        entries = self.covariance_entries()
        n = sum(count for _, count in entries)
        if not isinstance(factor, torch.Tensor) or not factor.is_floating_point():
            got = f"dtype {factor.dtype}" if isinstance(factor, torch.Tensor) else type(factor).__name__
            raise TypeError(f"the covariance factor must be a floating-point torch.Tensor of shape ({n}, {n}); "
                            f"got {got}")
        if factor.is_meta:
            raise ValueError(f"the covariance factor is on the meta device (a shape without data); give a ({n}, {n}) "
                             f"tensor with values, e.g. torch.eye({n})")
        if tuple(factor.shape) != (n, n):
            raise ValueError(f"the covariance factor must have shape ({n}, {n}) for the model's {n} perturbed "
                             f"entries; got {tuple(factor.shape)}")
        self.check_distribution(COVARIANCE)
        params = [layer.get_parameter(slot.name) for layer in self.layers.values() for slot in layer.slots]
        dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        held = factor.detach().to(device=params[0].device, dtype=dtype, copy=True).contiguous()
        if not bool(held.isfinite().all()):
            raise ValueError("the covariance factor must be finite everywhere")
        return {"factor": held, "entries": entries, "unit": None}

    def covariance_factor(self) -> torch.Tensor | None:
        """A, the tensor itself (change it through :meth:`set_covariance` or :meth:`assign_covariance_`)."""
        held = self.__dict__.get("_covariance")
        return None if held is None else held["factor"]

    def assign_covariance_(self, factor: torch.Tensor) -> None:
        """Copy ``factor`` into A, in place and unchecked (no host read): a strategy's new factor. The noise
        held keeps the old A until it is drawn again."""
        held = self.covariance_factor()
        if held is None:
            raise ValueError("assign_covariance_: the model has no covariance yet; set one with set_covariance")
        held.copy_(factor)

    def draw_noise(self, step: int, directions: range) -> None:
        """Every module's noise of ``directions`` at ``step`` (zero outside the step's subspace), then A applied
        across them (if set)."""
        for layer in self.layers.values():
            layer.set_noise(self.seed, step, directions.start, directions.stop)
        self.zero_outside_subspace(step)
        held = self.__dict__.get("_covariance")
        if held is not None:
            held["unit"] = self._mix(held)

    def redraw_noise(self) -> None:
        """Draw the current noise again (same step and directions), e.g. after its scales or A changed."""
        current = self.noise_range
        if current is not None:
            self.draw_noise(self.step, current)

    def _records(self, held: dict) -> list[torch.Tensor]:
        """The noise tensors of the perturbed parameters in A's order, after checking that the model still
        perturbs exactly the parameters A was set for."""
        records, entries = [], []
        for name, layer in self.layers.items():
            for slot in layer.slots:
                z = layer.noise_record(slot.name)["z"]
                records.append(z)
                entries.append((full_name(name, slot.name), z[0].numel()))
        if tuple(entries) != held["entries"]:
            raise ValueError(f"the model's perturbed parameters changed since its covariance was set (now "
                             f"{entries[:3]}..., then {list(held['entries'][:3])}...); set it again")
        return records

    def _mix(self, held: dict) -> torch.Tensor:
        """Y = Z A^T written into the noise records; returns the unit Z (D, n)."""
        records = self._records(held)
        factor = held["factor"]
        unit = torch.cat([z.reshape(z.shape[0], -1).to(factor.dtype) for z in records], dim=1)
        mixed = unit @ factor.t()
        start = 0
        for z in records:
            count = z[0].numel()
            z.copy_(mixed[:, start:start + count].view_as(z))
            start += count
        return unit

    def covariance_statistics(self, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What CMA-ES adapts by (Hansen 2016), over the current noise's directions, as an (n,) and an (n, n)
        tensor in A's dtype: ``sum_i w_i z_i`` over the members of positive weight (the recombination, in the
        unit noise z) and ``sum_i w'_i y_i y_i^T`` over all members (the rank-mu sum, in the noise as evaluated),
        a negative weight rescaled there, ``w'_i = w_i n / ||z_i||^2`` (active CMA-ES). ``weights`` as
        :meth:`scale_statistics` takes them, one per member (both signs of an antithetic pair share z_d up to
        its sign, and y y^T); chunks add up; no host read."""
        held, weights = self._statistics_input(weights)
        dtype, unit = held["factor"].dtype, held["unit"]
        positive = signed_weights(weights.clamp(min=0), self.antithetic)
        shrink = unit.shape[1] / unit.square().sum(1)  # n / ||z_d||^2, for the negative weights
        rescaled = torch.where(weights < 0, weights * shrink, weights)
        unsigned = statistic_weights(rescaled, self.local_directions, self.antithetic, None)
        mixed = torch.cat([z.reshape(z.shape[0], -1).to(dtype) for z in self._records(held)], dim=1)
        return positive @ unit, (mixed.t() * unsigned) @ mixed

    def natural_statistics(self, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What xNES adapts by, over the current noise's directions, in the unit noise z: ``sum_i w_i z_i`` (each
        member's weight with its sign) and ``sum_i w_i z_i z_i^T`` (without: a pair shares z z^T), as an (n,) and
        an (n, n) tensor in A's dtype; ``weights`` as :meth:`covariance_statistics` takes them."""
        held, weights = self._statistics_input(weights)
        unit = held["unit"]
        unsigned = statistic_weights(weights, self.local_directions, self.antithetic, None)
        return signed_weights(weights, self.antithetic) @ unit, (unit.t() * unsigned) @ unit

    def _statistics_input(self, weights: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """The covariance held and ``weights`` checked (as the update's) in its dtype."""
        held = self.__dict__.get("_covariance")
        if held is None or held["unit"] is None:
            raise ValueError("covariance statistics need a covariance (set_covariance) and noise drawn with it")
        device = held["factor"].device if getattr(weights, "is_meta", False) else None  # for the error
        check_weights(weights, self.local_directions, self.antithetic, device, check_finite=False)
        return held, weights.to(held["factor"].dtype)
