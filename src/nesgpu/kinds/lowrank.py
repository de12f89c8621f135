"""Low-rank noise (EGGROLL, arXiv 2511.16652): direction d's noise is ``z_d = A_d B_d^T / sqrt(r)``.

A_d (out x r) and B_d (in x r) are unit Gaussians; dividing by sqrt(r) gives every entry of z_d unit
variance, and E[z_d z_d^T] = I entrywise, so the estimator is unbiased. The forward never builds a
per-direction weight: it applies ``(x B_d) A_d^T``, two thin products.

Layouts: a matrix (Linear, an embedding table (num, dim), attention and recurrent weights) stores
a (D, r, out) and b (D, r, in). A convolution kernel (out, C/g, *kernel) is a matrix of out rows by
(C/g * prod(kernel)) columns per channel group: b holds r full-size filters per group (D, g, r, C/g,
*kernel) and a (D, g, out/g, r) mixes those r feature maps into the outputs (a per-direction 1x1 mix).
An embedding lookup of rows ``i`` gathers ``A_d[i]`` and multiplies by B_d: no per-direction table.

Noise memory: D * r * (out + in * prod(kernel)) values per parameter.

A sigma per parameter (SNES) on a plain matrix takes the form S = row x column (:func:`outer_factors`): S o z_d
= (row o A_d)(col o B_d)^T / sqrt(r) stays rank r, so ``scale_`` scales the factors and never a dense matrix.
The factors are Gaussian, so the search distribution is a diagonal Gaussian over them and its natural-gradient
statistic is per factor: ``scale_statistic`` gives sum_d w_d mean_k(A~_dki^2 - 1) + sum_d w_d mean_k(B~_dkj^2 - 1)
for entry (i, j) (A~, B~ the unit factors), a row plus a column, which a multiplicative update keeps an outer
product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .base import Kind, randn
from .ops import LinearOp

ELEMENTWISE_MAX_RANK = 4
"""Ranks up to this take r fused elementwise passes (on the CPU these beat a batched matmul whose D
batches are matrix-vector products); higher ranks use two batched matmuls."""

BATCHED_MIN_POSITIONS = 8
"""Rows with at least this many positions (sequences) use batched matmuls whatever the rank: each of the
R * D batches is then a real (positions x in) product, and the elementwise path's full-size temporary
would cost a pass over the input."""


def _project(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x_{r,d} B_d^T: x (R, D, M, in), b (D, r, in) -> (R, D, M, r). Rank 1 as one fused dot product per
    position, higher ranks as one bmm over the R * D rows (torch.matmul's broadcast over R is 4x slower)."""
    r_, d, m, i = x.shape
    if b.shape[1] == 1:
        return torch.linalg.vecdot(x, b.view(1, d, 1, i)).unsqueeze(-1)
    rows_b = b.unsqueeze(0).expand(r_, d, b.shape[1], i).reshape(r_ * d, b.shape[1], i)
    return torch.bmm(x.reshape(r_ * d, m, i), rows_b.transpose(1, 2)).view(r_, d, m, -1)


def _signed_factors(a: torch.Tensor, bias_z: torch.Tensor | None, signed: torch.Tensor):
    """A_d (D, r, out) and bias_d (D, out) times each sign's sigma, as (S, 1, D, r, out) and (S, 1, D, 1, out):
    the shapes that broadcast against x B_d^T laid out (S, R / S, D, M, r)."""
    s, (d, r, out) = signed.shape[0], a.shape
    a_s = (signed.view(s, 1, 1, 1) * a.unsqueeze(0)).view(s, 1, d, r, out)
    c = None if bias_z is None else (signed.view(s, 1, 1) * bias_z.unsqueeze(0)).view(s, 1, d, 1, out)
    return a_s, c


def _signed_of(noise, signed: torch.Tensor, bias_z: torch.Tensor | None):
    """:func:`_signed_factors` of a step's noise record, kept with it while sigma and the noise stay the same."""
    return noise.derived("signed_lowrank", (signed, noise["a"], bias_z), lambda: _signed_factors(
        noise["a"], bias_z, signed))


def _noise_projection(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x_{r,d} B_d^T as (R, D, M, r); one position per row (decode) as one batched GEMM over a strided view of x,
    (D, R, r) viewed (R, D, 1, r)."""
    r_, d, m, i = x.shape
    if m == 1:
        return torch.bmm(x.view(r_, d, i).transpose(0, 1), b.transpose(1, 2)).transpose(0, 1).unsqueeze(2)
    return _project(x, b)


def _fused_product(x, weight_t, bias, a_s, c, b) -> torch.Tensor:
    """x (R, D, M, in) @ weight_t + bias + signed_r (x B_d^T) A_d (+ signed_r bias_d), as (R, D, M, out): the
    noise's product written first into a row-major buffer, then the GEMM accumulates the shared product into it.
    ``a_s``, ``c``: A_d and bias_d times each sign's sigma (:func:`_signed_factors`)."""
    r_, d, m, i = x.shape
    s, rank, out = a_s.shape[0], a_s.shape[3], a_s.shape[4]
    t = _noise_projection(x, b).reshape(s, r_ // s, d, m, rank)
    if bias is not None:
        c = bias if c is None else c + bias
    p = x.new_empty(s, r_ // s, d, m, out)  # row-major whatever t's strides, for the GEMM's view
    if rank > 1:
        torch.matmul(t, a_s, out=p)
        if c is not None:
            p.add_(c)
    elif c is None:
        torch.mul(t, a_s, out=p)
    else:
        torch.addcmul(c, t, a_s, out=p)
    flat = p.view(-1, out)
    torch.addmm(flat, x.reshape(-1, i), weight_t, out=flat)
    return flat.view(r_, d, m, out)


def outer_factors(scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of an outer-product scale S = row x col (out, in): its first column and its first row over
    S[0, 0]."""
    return scale[:, 0].contiguous(), scale[0] / scale[0, 0]


@dataclass(frozen=True)
class LowRank(Kind):
    """Low-rank noise: direction d's noise is A_d B_d^T / sqrt(r), never formed densely.

    Args:
        rank: r, the rank of each direction's noise (default 1). A rank above the entries of every matrix of
            the model is refused (its factors would outgrow dense noise); a matrix smaller than r takes it as it is.
    """

    name = "lowrank"
    products = frozenset({"linear", "conv", "embedding", "experts"})
    outer_scale = True
    rank: int = field(default=1, metadata={"help": "rank of each direction's noise matrix"})

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank must be a positive int; got {self.rank!r}")

    @staticmethod
    def largest_rank(geometry) -> int:
        """The entries of one group's noise matrix of ``geometry`` (a convolution's columns are its filters,
        C/g * prod(kernel)): a rank beyond them draws factors larger than the dense noise itself."""
        g = geometry
        return g.out // g.groups * (g.in_ // g.groups * math.prod(g.kernel))

    def check_model(self, geometries):
        if not geometries:
            return
        name, most = max(((n, self.largest_rank(g)) for n, g in geometries.items()), key=lambda item: item[1])
        if self.rank > most:
            raise ValueError(f"rank={self.rank} is more than the entries of any matrix of the model (the largest, "
                             f"{name}, has {most}): its noise factors would outgrow dense noise; expected rank <= "
                             f"{most}, or layer 'gaussian' for full-rank noise")

    def draw_directions(self, gen, n, geometry, like):
        g, r = geometry, self.rank
        if g.is_matrix:
            a = randn(like, n, r, g.out, gen=gen).div_(math.sqrt(r))
            return {"a": a, "b": randn(like, n, r, g.in_, gen=gen)}
        a = randn(like, n, g.groups, g.out // g.groups, r, gen=gen).div_(math.sqrt(r))
        return {"a": a, "b": randn(like, n, g.groups, r, *g.shape[1:], gen=gen)}

    def apply_(self, op, x, y, scale, noise):
        a, b, g = noise["a"], noise["b"], noise.geometry
        if g.is_matrix:
            d = a.shape[0]
            rows = op.per_repeat(scale, x)
            if self._batched(op, x, y):
                self._batched_linear_(x, y, rows, a, b, None)
                return
            one_position = x.shape[2] == 1 and isinstance(op, LinearOp) and x.is_contiguous() and y.is_contiguous()
            if self.rank <= ELEMENTWISE_MAX_RANK and one_position:
                # one position per row (an MLP): x B_d^T for all rows of direction d as one batched GEMM over
                # a strided view of x (no copy, no full-size temporary), then r passes over y
                r_, i = x.shape[0], x.shape[3]
                t = torch.bmm(x.view(r_, d, i).transpose(0, 1), b.transpose(1, 2))  # (D, R, r)
                t.mul_(scale.view(1, r_, 1).to(t.dtype))
                y_rows = y.view(r_, d, -1)
                for k in range(self.rank):
                    y_rows.addcmul_(t[:, :, k].t().unsqueeze(-1), a[:, k].unsqueeze(0))
                return
            if self.rank <= ELEMENTWISE_MAX_RANK:
                for k in range(self.rank):
                    t = (x * op.per_channel(b[:, k], x)).sum(op.channel_dim, keepdim=True).mul_(rows)
                    y.addcmul_(t, op.per_channel(a[:, k], y))
                return
            t = op.per_direction(x, b, 1).mul_(rows)  # (R, D, M, r)
            y.add_(torch.einsum("rdmk,dko->rdmo", t, a.view(d, self.rank, -1)))
            return
        # convolution: r filters per group, then a per-direction mix of the r maps into the outputs
        d, r_ = a.shape[0], x.shape[0]
        t = op.per_direction(x, b.reshape(d, g.groups * self.rank, *b.shape[3:]), g.groups)
        t = t.view(r_, d, g.groups, self.rank, -1).mul_(scale.view(-1, 1, 1, 1, 1))
        y_groups = y.view(r_, d, g.groups, g.out // g.groups, -1)
        if self.rank <= ELEMENTWISE_MAX_RANK:  # r fused passes over y, no temporary
            for k in range(self.rank):
                y_groups.addcmul_(t[:, :, :, k : k + 1], a[..., k].unsqueeze(-1))
        else:
            y_groups.add_(torch.einsum("rdgkp,dgok->rdgop", t, a))

    def apply_shared_(self, x, y, noise):
        a, b, g = noise["a"], noise["b"], noise.geometry
        if not g.is_matrix or g.groups != 1:
            super().apply_shared_(x, y, noise)
            return
        bsz, d, r = x.shape[0], a.shape[0], self.rank
        t = (x @ b.reshape(d * r, -1).t()).view(bsz, d, r)  # x B_d^T for every sample and direction: one GEMM
        for k in range(r):
            y.addcmul_(t[:, :, k : k + 1], a[:, k].unsqueeze(0))

    @staticmethod
    def _batched(op, x, y) -> bool:
        """Many positions per row (a sequence): batched matmuls beat the elementwise passes."""
        return isinstance(op, LinearOp) and x.shape[2] >= BATCHED_MIN_POSITIONS and y.is_contiguous()

    def _batched_linear_(self, x, y, rows, a, b, bias) -> None:
        """y += rows_r (x B_d^T) A_d (+ rows_r bias_d): one batched matmul per factor, accumulated in place.
        A bias's noise rides along as one more rank-one factor (a column of ones times bias_d)."""
        r_, d, out = x.shape[0], a.shape[0], a.shape[2]
        t = _project(x, b).mul_(rows)  # (R, D, M, r), no copy of x
        if bias is not None:
            t = torch.cat([t, rows.expand(r_, d, x.shape[2], 1)], dim=-1)
            a = torch.cat([a, bias.unsqueeze(1)], dim=1)
        k = a.shape[1]
        a_rows = a.unsqueeze(0).expand(r_, d, k, out).reshape(r_ * d, k, out)
        y.view(r_ * d, -1, out).baddbmm_(t.view(r_ * d, -1, k), a_rows)

    def linear_product(self, x, weight_t, bias, signed, noise, bias_z):
        # the noise's product first, then one GEMM that accumulates the shared product into it (beta = 1):
        # the GEMM reads the perturbation as its accumulator instead of a second pass over its output. Sigma
        # and the signs are folded into A_d (and bias_d) once per step, so a decode step adds three operations
        # per layer at rank 1: x B_d^T, (x B_d^T) A_d (+ bias), and the GEMM.
        if not noise.geometry.is_matrix:
            return None
        a_s, c = _signed_of(noise, signed, bias_z)
        if torch.compiler.is_compiling():  # the compiler picks the layouts and fuses the noise into one kernel
            r_, d, m, i = x.shape
            t = _noise_projection(x, noise["b"]).reshape(a_s.shape[0], r_ // a_s.shape[0], d, m, self.rank)
            c = c if bias is None else bias if c is None else c + bias
            p = torch.matmul(t, a_s) if self.rank > 1 else t * a_s
            p = (p if c is None else p + c).reshape(-1, a_s.shape[-1])
            return torch.addmm(p, x.reshape(-1, i), weight_t).view(r_, d, m, -1)
        return _fused_product(x, weight_t, bias, a_s, c, noise["b"])

    def linear_plan(self, signed, noise, bias_z):
        if not noise.geometry.is_matrix or torch.compiler.is_compiling():
            return None
        (a_s, c), b = _signed_of(noise, signed, bias_z), noise["b"]
        return lambda x, weight_t, bias: _fused_product(x, weight_t, bias, a_s, c, b)

    def apply_with_bias_(self, op, x, y, scale, noise, bias):
        if noise.geometry.is_matrix and self._batched(op, x, y):
            self._batched_linear_(x, y, op.per_repeat(scale, x), noise["a"], noise["b"], bias)
            return
        super().apply_with_bias_(op, x, y, scale, noise, bias)

    def embed_(self, index, y, scale, noise):
        a, b = noise["a"], noise["b"]  # (D, r, num), (D, r, dim)
        d, r, num = a.shape
        # A_d's looked-up entries through one flat index_select: row (d, i) of a (D * num, r) table
        flat = (index + torch.arange(d, device=index.device).view(1, d, 1) * num).reshape(-1)
        t = a.transpose(1, 2).reshape(d * num, r).index_select(0, flat).view(*index.shape, r)
        t.mul_(scale.view(-1, 1, 1, 1))
        if r <= ELEMENTWISE_MAX_RANK:  # r fused passes over y, no temporary
            for k in range(r):
                y.addcmul_(t[..., k : k + 1], b[:, k].unsqueeze(0).unsqueeze(2))
            return
        y.add_(torch.einsum("rdmk,dkj->rdmj", t, b))

    def scale_(self, noise, scale):
        row, col = outer_factors(scale)
        noise["a"].mul_(row)  # a (D, r, out): (row o A_d)
        noise["b"].mul_(col)  # b (D, r, in): (col o B_d)

    def scale_statistic(self, noise, scale, weights, first=False):
        if first:
            raise ValueError("low-rank noise has no sum_d w_d z_d statistic per entry (CMA-ES's paths): use layer "
                             "'gaussian'")
        a, b = noise["a"] * math.sqrt(self.rank), noise["b"]  # unit Gaussian factors once S is divided out
        if scale is not None:
            row, col = outer_factors(scale)
            a, b = a / row, b / col
        rows = torch.einsum("d,dko->o", weights, a.square() - 1) / self.rank  # (D, r, out) temporaries at most
        cols = torch.einsum("d,dki->i", weights, b.square() - 1) / self.rank
        return rows.unsqueeze(1) + cols.unsqueeze(0)

    def zero_rows_(self, noise, row):
        noise["a"][:, :, row] = 0  # a (D, r, num): z_d[row] = A_d[row] B_d^T

    def experts_(self, x, y, scale, direction, noise, expert):
        a, b = noise["a"][direction, expert], noise["b"][direction, expert]  # (M, out, r), (M, r, in): grouped layout
        t = torch.bmm(b, x.unsqueeze(-1)).mul_(scale.view(-1, 1, 1))  # (M, r, 1)
        y.add_(torch.bmm(a, t).squeeze(-1))

    def grad(self, noise, coef):
        a, b, g = noise["a"], noise["b"], noise.geometry
        d = coef.shape[0]
        if g.is_matrix:  # sum_d coef_d a_d^T b_d as one GEMM over the D * r rank-one factors
            return (a * coef.view(d, 1, 1)).reshape(d * self.rank, g.out).t() @ b.reshape(d * self.rank, g.in_)
        grad = torch.einsum("dgok,dgkf->gof", a * coef.view(d, 1, 1, 1), b.flatten(3))
        return grad.reshape(g.shape)

    def grad_rows(self, noise, coef, rows):
        a, b, g = noise["a"], noise["b"], noise.geometry
        if not g.is_matrix:
            return None
        d = coef.shape[0]  # (D, r, out) sliced to the rows' A factors: the same GEMM, only those rows
        part = a[:, :, rows] * coef.view(d, 1, 1)
        return part.reshape(d * self.rank, -1).t() @ b.reshape(d * self.rank, g.in_)

    def dense(self, noise):
        a, b, g = noise["a"], noise["b"], noise.geometry
        if g.is_matrix:
            return a.transpose(1, 2) @ b
        return torch.einsum("dgok,dgkf->dgof", a, b.flatten(3)).reshape(a.shape[0], *g.shape)

    def sq_norms(self, noise):
        a, b, g = noise["a"], noise["b"], noise.geometry
        if g.is_matrix:  # ||sum_k a_k b_k^T||^2 = sum_{k,l} (a_k . a_l)(b_k . b_l)
            return ((a @ a.transpose(1, 2)) * (b @ b.transpose(1, 2))).sum((1, 2))
        b = b.flatten(3)  # (D, G, r, F); a is (D, G, out_g, r)
        return ((a.transpose(2, 3) @ a) * (b @ b.transpose(2, 3))).sum((1, 2, 3))
