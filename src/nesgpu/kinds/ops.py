"""How a weight multiplies a population input: the products every noise kind is written against.

A noise kind never knows which module it perturbs. It sees a :class:`Geometry` (the weight as ``out`` rows
by ``in`` columns, in ``groups``, with a ``kernel``) and an :class:`Op`, which says how a weight-shaped
tensor meets the input. The population input is laid out ``(R, D, ...)``: R repeats, D directions.

- :class:`LinearOp`: x is ``(R, D, M, in)`` (M positions per row, e.g. a sequence), y ``(R, D, M, out)``.
- :class:`ConvOp`: x is ``(R, D, C_in, *spatial)``, y ``(R, D, C_out, *spatial_out)``, for 1, 2 or 3
  spatial dimensions, with the module's stride, padding (and padding mode) and dilation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Geometry:
    """A weight of shape ``(out, in // groups, *kernel)``, seen per group as a matrix (out/groups rows)."""

    out: int
    in_: int
    groups: int = 1
    kernel: tuple[int, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.out, self.in_ // self.groups, *self.kernel)

    @property
    def is_matrix(self) -> bool:
        """A plain (out, in) matrix: no groups, no kernel."""
        return self.groups == 1 and not self.kernel

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Op:
    """The product of a population input with weight-shaped tensors (see the module docstring)."""

    channel_dim: int  # where x's and y's channels live in the (R, D, ...) layout

    def per_channel(self, v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """v (D, C) as a view that broadcasts against ``like`` (R, D, ...) on the channel dimension."""
        shape = [1] * like.dim()
        shape[1], shape[self.channel_dim] = v.shape[0], v.shape[1]
        return v.view(shape)

    @staticmethod
    def per_repeat(scale: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """scale (R,) as a view that broadcasts against ``like`` (R, D, ...)."""
        return scale.view(-1, *([1] * (like.dim() - 1)))

    def shared(self, x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
        """x times one weight (k, C / groups, *kernel) that all directions share."""
        raise NotImplementedError

    def per_direction(self, x: torch.Tensor, w: torch.Tensor, groups: int) -> torch.Tensor:
        """x times direction d's own weight w[d], w of shape (D, k, C / groups, *kernel)."""
        raise NotImplementedError

    def gather_channels(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Row (r, d) keeps channels ``index[d]`` (index of shape (D, K)), in that order."""
        raise NotImplementedError

    def scatter_add_channels_(self, y: torch.Tensor, index: torch.Tensor, h: torch.Tensor) -> None:
        """y += h placed at channels ``index[d]`` (the inverse of gather_channels)."""
        raise NotImplementedError


class LinearOp(Op):
    """x (R, D, M, in) -> (R, D, M, out)."""

    channel_dim = 3

    def shared(self, x, w, groups):
        return F.linear(x, w)

    def per_direction(self, x, w, groups):
        return torch.einsum("rdmi,doi->rdmo", x, w)

    def gather_channels(self, x, index):
        r, d, m = x.shape[:3]
        return x.gather(3, index.view(1, d, 1, -1).expand(r, d, m, -1))

    def scatter_add_channels_(self, y, index, h):
        r, d, m = y.shape[:3]
        y.scatter_add_(3, index.view(1, d, 1, -1).expand(r, d, m, -1), h)

    def __repr__(self) -> str:
        return "LinearOp()"


@dataclass(frozen=True)
class ConvOp(Op):
    """A convolution with this geometry, over 1, 2 or 3 spatial dimensions."""

    dims: int
    stride: tuple[int, ...]
    padding: tuple[int, ...] | str
    dilation: tuple[int, ...]
    padding_mode: str = "zeros"
    # F.pad's argument for non-"zeros" padding modes (torch's _reversed_padding_repeated_twice)
    explicit_padding: tuple[int, ...] = ()
    channel_dim = 2

    @classmethod
    def of(cls, conv: torch.nn.modules.conv._ConvNd) -> ConvOp:
        return cls(len(conv.kernel_size), tuple(conv.stride), conv.padding if isinstance(conv.padding, str)
                   else tuple(conv.padding), tuple(conv.dilation), conv.padding_mode,
                   tuple(conv._reversed_padding_repeated_twice))

    def conv(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, groups: int) -> torch.Tensor:
        """Plain convolution of x (N, C, *spatial) with this geometry."""
        fn = (F.conv1d, F.conv2d, F.conv3d)[self.dims - 1]
        if self.padding_mode != "zeros":
            x = F.pad(x, self.explicit_padding, mode=self.padding_mode)
            return fn(x, w, bias, self.stride, 0, self.dilation, groups)
        return fn(x, w, bias, self.stride, self.padding, self.dilation, groups)

    def shared(self, x, w, groups):
        r, d = x.shape[:2]
        out = self.conv(x.reshape(r * d, *x.shape[2:]), w, None, groups)
        return out.view(r, d, *out.shape[1:])

    def per_direction(self, x, w, groups):
        # the D per-direction kernels as one grouped convolution with D * groups groups
        r, d, c = x.shape[:3]
        out = self.conv(x.reshape(r, d * c, *x.shape[3:]), w.reshape(-1, *w.shape[2:]), None, d * groups)
        return out.view(r, d, w.shape[1], *out.shape[2:])

    def gather_channels(self, x, index):
        # copy whole contiguous feature maps: much faster than an elementwise gather
        r, k = x.shape[0], index.shape[1]
        rows = _plane_index(index, r, x.shape[2])
        return x.reshape(-1, *x.shape[3:]).index_select(0, rows).view(r, index.shape[0], k, *x.shape[3:])

    def scatter_add_channels_(self, y, index, h):
        rows = _plane_index(index, y.shape[0], y.shape[2])
        y.view(-1, *y.shape[3:]).index_add_(0, rows, h.reshape(-1, *h.shape[3:]))


def _plane_index(index: torch.Tensor, repeats: int, channels: int) -> torch.Tensor:
    d = index.shape[0]
    first = torch.arange(repeats * d, device=index.device).mul_(channels).view(repeats, d, 1)
    return (first + index.unsqueeze(0)).reshape(-1)


LINEAR = LinearOp()
