"""Perturbed normalisation layers: LayerNorm, RMSNorm, GroupNorm and BatchNorm's affine parameters.

Each normalises without its affine parameters, then applies every member's own scale and shift,
``theta + sigma * s_r * z_d`` (IID Gaussian, elementwise), in one fused pass. Population calls never
mix members: LayerNorm, RMSNorm and GroupNorm normalise within a row anyway; BatchNorm in training
mode uses each member's own batch statistics (over that member's repeats) and in eval mode the running
statistics. No population call writes the running buffers: ES never updates them (use
``track_running_stats=False``, or refresh them with plain forwards of the trained model).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import Gaussian
from .base import PerturbedModule
from .layout import PopulationCall


class _ElementwiseAffine(PerturbedModule):
    """y = normalised * weight + bias, with per-member weight and bias."""

    def _init_norm(self, directions) -> None:
        self.init_perturbation(Gaussian(), directions, {}, "elementwise")

    def _affine(self, normalised: torch.Tensor, pop: PopulationCall, shape: tuple[int, ...]) -> torch.Tensor:
        """normalised viewed as (R, D, *shape) per the caller; weight / bias broadcast on ``shape``."""
        def values(name):  # (R, D, *shape), or (1, 1, *shape) when frozen
            if getattr(self, name, None) is None:
                return None
            t = self.member_values(name, pop, normalised.dtype)
            return t.view(t.shape[0], t.shape[1], *shape)

        weight, bias = values("weight"), values("bias")
        # ``normalised`` is this call's own fresh tensor: the affine map overwrites it in one pass
        if weight is not None and bias is not None:
            return torch.addcmul(bias, normalised, weight, out=normalised)
        if weight is not None:
            return normalised.mul_(weight)
        return normalised.add_(bias) if bias is not None else normalised

    def _affine_last(self, x: torch.Tensor, normalised: torch.Tensor) -> torch.Tensor:
        """Every member's affine map over the last ``normalized_shape`` dims of ``normalised`` (shaped as x)."""
        pop = self.population_of(x.shape[0], normalised.dtype, x.device)
        k = math.prod(self.normalized_shape)
        return self._affine(normalised.view(pop.repeats, pop.directions, -1, k), pop, (1, k)).view(x.shape)


class PerturbedLayerNorm(_ElementwiseAffine, nn.LayerNorm):
    """nn.LayerNorm with per-member weight and bias. Shape: (R * D, *, *normalized_shape)."""

    ROW_WISE = True

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None, *,
                 directions=None):
        nn.LayerNorm.__init__(self, normalized_shape, eps, elementwise_affine, bias, device, dtype)
        self._init_norm(directions)

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._affine_last(x, F.layer_norm(x, self.normalized_shape, None, None, self.eps))


class PerturbedRMSNorm(_ElementwiseAffine, nn.RMSNorm):
    """nn.RMSNorm with a per-member weight. Shape: (R * D, *, *normalized_shape)."""

    ROW_WISE = True

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None, *,
                 directions=None):
        nn.RMSNorm.__init__(self, normalized_shape, eps, elementwise_affine, device, dtype)
        self._init_norm(directions)

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._affine_last(x, F.rms_norm(x, self.normalized_shape, None, self.eps))


def _channels_view(x: torch.Tensor, pop: PopulationCall) -> torch.Tensor:
    """(R * D, C, *spatial) -> (R, D, C, L)."""
    return x.view(pop.repeats, pop.directions, x.shape[1], -1)


class PerturbedGroupNorm(_ElementwiseAffine, nn.GroupNorm):
    """nn.GroupNorm with per-member per-channel weight and bias. Shape: (R * D, C, *)."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None, *, directions=None):
        nn.GroupNorm.__init__(self, num_groups, num_channels, eps, affine, device, dtype)
        self._init_norm(directions)

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"{type(self).__name__}: expected input of shape (repeats * directions, "
                             f"{self.num_channels}, *); got {tuple(x.shape)}")
        normalised = F.group_norm(x, self.num_groups, None, None, self.eps)
        pop = self.population_of(x.shape[0], normalised.dtype, x.device)
        return self._affine(_channels_view(normalised, pop), pop, (self.num_channels, 1)).view(x.shape)


class _PerturbedBatchNorm(_ElementwiseAffine):
    """BatchNorm whose population forward normalises each member by its own statistics (training) or by
    the running statistics (eval), and never writes the running buffers."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, *, directions=None):
        super(_ElementwiseAffine, self).__init__(num_features, eps, momentum, affine, track_running_stats, device,
                                                 dtype)
        self._init_norm(directions)

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        pop = self.population_of(x.shape[0], x.dtype, x.device)
        xv = _channels_view(x, pop)  # (R, D, C, L)
        if self.training or self.running_mean is None:
            signs = 2 if self.perturbation.active.antithetic else 1
            per_member = xv.view(signs, pop.repeats // signs, pop.directions, self.num_features, -1)
            count = per_member.shape[1] * per_member.shape[4]
            if count < 2:
                raise ValueError(f"{type(self).__name__}: each member has {count} value per channel; batch "
                                 f"statistics need at least 2 (more repeats or spatial positions), or use eval mode")
            var, mean = torch.var_mean(per_member, dim=(1, 4), correction=0, keepdim=True)
            normalised = ((per_member - mean) * torch.rsqrt(var + self.eps)).view(xv.shape)
        else:
            normalised = _channels_view(F.batch_norm(x, self.running_mean, self.running_var, None, None, False, 0.0,
                                                     self.eps), pop)
        return self._affine(normalised, pop, (self.num_features, 1)).view(x.shape)


class PerturbedBatchNorm1d(_PerturbedBatchNorm, nn.BatchNorm1d):
    """nn.BatchNorm1d, population-safe. Shape: (R * D, C) or (R * D, C, L)."""


class PerturbedBatchNorm2d(_PerturbedBatchNorm, nn.BatchNorm2d):
    """nn.BatchNorm2d, population-safe. Shape: (R * D, C, H, W)."""


class PerturbedBatchNorm3d(_PerturbedBatchNorm, nn.BatchNorm3d):
    """nn.BatchNorm3d, population-safe. Shape: (R * D, C, D', H, W)."""
