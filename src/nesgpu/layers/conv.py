"""Perturbed nn.Conv1d / Conv2d / Conv3d: any kind but sparse; the classic Conv2d names fix the kind."""

from __future__ import annotations

import torch
from torch import nn

from ..kinds import ConvOp, Flipout, Geometry, LowRank, Permuted, make_kind
from .base import PerturbedModule


class _PerturbedConv(PerturbedModule):
    """Population forward of every convolution: input (R * D, C_in, *spatial)."""

    def _init_conv(self, kind, directions, options) -> None:
        geometry = Geometry(self.out_channels, self.in_channels, self.groups, tuple(self.kernel_size))
        self.init_perturbation(make_kind(kind, **options), directions, {"weight": geometry}, "conv")
        self.op = ConvOp.of(self)

    def _base_weight(self) -> torch.Tensor:
        """The kernel of the shared (unperturbed) product; a low-bit layer's is its quantised kernel."""
        return self.weight

    def check_input(self, x: torch.Tensor) -> None:
        dims = len(self.kernel_size)
        if x.dim() != dims + 2 or x.shape[1] != self.in_channels:
            raise ValueError(f"{type(self).__name__}: expected input of shape (repeats * directions, "
                             f"{self.in_channels}, {dims} spatial dims); got {tuple(x.shape)}")

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        y = self._conv_forward(x, self._base_weight(), self.bias)
        pop = self.population_of(x.shape[0], y.dtype, y.device)
        y_rows = y.view(pop.repeats, pop.directions, *y.shape[1:])
        self.add_product_("weight", self.op, x.to(y.dtype).view(pop.repeats, pop.directions, *x.shape[1:]), y_rows,
                      pop.scale)
        if self.bias is not None:
            self.add_vector_("bias", self.op, y_rows, pop.scale)
        return y


def _conv_class(parent: type[nn.Module], dims: int) -> type:
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, *, kind="gaussian", directions=None,
                 **options):
        parent.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                        padding_mode, device, dtype)
        self._init_conv(kind, directions, options)

    name = f"PerturbedConv{dims}d"
    doc = f"""nn.Conv{dims}d whose population forward adds each direction's kernel noise (IID Gaussian by default).

    The per-direction product runs as one grouped convolution (D * groups groups) or, for shared-noise
    kinds, as one convolution with the shared kernel around per-direction channel moves.

    Args:
        as for :class:`torch.nn.Conv{dims}d`, plus ``kind`` (a Kind or its name; any but "sparse"),
        the kind's ``**options`` and ``directions``.

    Shape:
        population input (R * D, C_in, *spatial) -> (R * D, C_out, *spatial_out); row n uses direction n % D.
    """
    return type(name, (_PerturbedConv, parent), {"__init__": __init__, "__doc__": doc, "__module__": __name__,
                                                  "__qualname__": name})


PerturbedConv1d = _conv_class(nn.Conv1d, 1)
PerturbedConv2d = _conv_class(nn.Conv2d, 2)
PerturbedConv3d = _conv_class(nn.Conv3d, 3)


class PermutedConv2d(PerturbedConv2d):
    """PerturbedConv2d with kind :class:`nesgpu.kinds.Permuted` (channel permutations inside groups)."""

    def __init__(self, *args, directions=None, permutation="auto", in_sparsity=None, out_sparsity=None, **kwargs):
        super().__init__(*args, kind=Permuted(permutation, in_sparsity, out_sparsity), directions=directions, **kwargs)


class FlipoutConv2d(PerturbedConv2d):
    """PerturbedConv2d with kind :class:`nesgpu.kinds.Flipout` (channel sign flips)."""

    def __init__(self, *args, directions=None, signs="both", **kwargs):
        super().__init__(*args, kind=Flipout(signs), directions=directions, **kwargs)


class LowRankConv2d(PerturbedConv2d):
    """PerturbedConv2d with kind :class:`nesgpu.kinds.LowRank`: r full filters and a per-direction 1x1 mix."""

    def __init__(self, *args, directions=None, rank=1, **kwargs):
        super().__init__(*args, kind=LowRank(rank), directions=directions, **kwargs)
