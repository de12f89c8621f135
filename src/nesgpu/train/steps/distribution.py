"""The search distribution an ES step samples from, as one object: isotropic (one sigma for every parameter),
a sigma per parameter (SNES, CEM, separable CMA-ES: the scales S) or a full covariance (CMA-ES, xNES: the factor
A). Each says how it starts, how the population's update adapts it, its mean scale and what a checkpoint
keeps of it; :func:`distribution_for` is the one place that reads which one a strategy adapts."""

from __future__ import annotations

import torch

from ...population import Population
from ...strategies import Strategy


class Isotropic:
    """One sigma for every parameter (the strategy's state holds it): nothing else to adapt or keep."""

    adapts = False

    def __init__(self, strategy: Strategy, population: Population):
        self.strategy, self.population = strategy, population
        self.paths: dict = {}  # a strategy's own per-parameter tensors (CMA-ES's evolution paths)

    def start(self) -> None:
        """Before the first step: nothing to set."""

    def update(self, weights: torch.Tensor, sigma: float, asked, told, fitness: torch.Tensor):
        """The population's update into ``.grad``, for a step asked at strategy state ``asked`` and told into
        ``told``; returns the strategy's state after the distribution adapted (``told`` here)."""
        self.population.update(weights, sigma)
        return told

    def mean_scale(self) -> torch.Tensor | None:
        """The mean scale of the noise per entry (None: sigma alone)."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""


class DiagonalScales(Isotropic):
    """A sigma per parameter: scales S (1 at the start), adapted from the statistics the update's pass sums."""

    adapts = True

    def start(self) -> None:
        pm = self.population.pm
        pm.check_scalable(self.strategy.name, self.strategy.outer_scales)
        pm.set_scales(pm.unit_scales())

    def update(self, weights: torch.Tensor, sigma: float, asked, told, fitness: torch.Tensor):
        strategy, pm = self.strategy, self.population.pm
        seconds, means = self.population.update_scaled(weights, sigma, strategy.scale_weights(asked, fitness),
                                                       means=strategy.needs_means)
        scales, self.paths, state = strategy.adapt(told, pm.scales(), seconds, means, self.paths)
        pm.assign_scales_({name: value.clamp_(min=torch.finfo(value.dtype).tiny, max=torch.finfo(value.dtype).max)
                           for name, value in scales.items()})
        return state

    def mean_scale(self) -> torch.Tensor:
        """The mean of S."""
        scales = self.population.pm.scales().values()
        return sum(s.sum() for s in scales) / sum(s.numel() for s in scales)

    def state_dict(self) -> dict:
        return {"scales": self.population.pm.scales(), **({"paths": self.paths} if self.paths else {})}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state.get("scales"), dict):
            raise ValueError(f"the checkpoint holds no per-parameter sigma (scales) for strategy "
                             f"{self.strategy.name!r}")
        self.population.pm.set_scales(state["scales"])
        self.paths = dict(state.get("paths") or {})


class FullCovariance(Isotropic):
    """A covariance across every perturbed parameter: its factor A (I at the start), adapted from CMA-ES's
    statistics or, for xNES, the natural ones."""

    adapts = True

    def start(self) -> None:
        pm = self.population.pm
        pm.set_covariance(torch.eye(pm.num_perturbed))  # in the noise's dtype

    def update(self, weights: torch.Tensor, sigma: float, asked, told, fitness: torch.Tensor):
        strategy, pm = self.strategy, self.population.pm
        first, second = self.population.update_covariance(weights, sigma, strategy.scale_weights(asked, fitness),
                                                          natural=strategy.natural_statistics)
        factor, self.paths, state = strategy.adapt_covariance(told, pm.covariance_factor(), first, second,
                                                              self.paths)
        if factor is not None:
            pm.assign_covariance_(factor)
        return state

    def mean_scale(self) -> torch.Tensor:
        """The mean of A's rows' norms, sqrt(C_ii)."""
        return self.population.pm.covariance_factor().norm(dim=1).mean()

    def state_dict(self) -> dict:
        return {**({"paths": self.paths} if self.paths else {}), "covariance": self.population.pm.covariance_factor()}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state.get("covariance"), torch.Tensor):
            raise ValueError(f"the checkpoint holds no covariance for strategy {self.strategy.name!r}")
        self.population.pm.set_covariance(state["covariance"])
        self.paths = dict(state.get("paths") or {})


def distribution_for(strategy: Strategy, population: Population) -> Isotropic:
    """The distribution ``strategy`` adapts: a covariance, a sigma per parameter, or sigma alone."""
    if strategy.adapts_covariance:
        return FullCovariance(strategy, population)
    if strategy.adapts_scales:
        return DiagonalScales(strategy, population)
    return Isotropic(strategy, population)


__all__ = ["DiagonalScales", "FullCovariance", "Isotropic", "distribution_for"]
