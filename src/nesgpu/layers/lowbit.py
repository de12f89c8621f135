"""Low-bit perturbed Linear and Conv1d/2d/3d: binary (bits=1) or int8 (bits=8) weights from float latents.

The module keeps float latent weights ``theta`` (its state_dict is its torch parent's), which ES perturbs and
the optimizer steps. Its plain forward multiplies with ``Q(theta)``, their quantisation (see
:mod:`nesgpu.quantize`: a per-output-channel scale times +-1, or times an int8 code). Biases stay float.

Where the noise goes (``noise_on``):

- ``"latent"`` (default): member (r, d) computes with ``Q(theta + sigma s_r z_d)``: every member is itself a
  low-bit network, and ES estimates the gradient of the smoothed objective ``E f(Q(theta + sigma eps))``,
  which needs no straight-through trick. The members' low-bit weights are built densely (one
  ``(signs * D, *weight)`` tensor per call, kept while the noise, sigma and weights stay the same) and
  applied as one batched product: a product with P different matrices, as for IID Gaussian noise.
- ``"quantized"``: member (r, d) computes with ``Q(theta) + sigma s_r z_d``: one shared low-bit product plus
  the noise kind's own (structured, cheap) product in float. The estimate is the gradient at the low-bit
  weights, applied to the latents (a straight-through estimate made by ES).

``LowBitLinear(act_bits=8)`` also quantises each input row to int8 (one scale per row) and runs the shared
low-bit product as an int8 GEMM with int32 accumulation, which is where low-bit weights pay on hardware
with int8 units; the noise products see the same quantised input in float.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import LINEAR, LinearOp, Op, make_kind
from ..quantize import check_bits, codes, int8_linear, quantize
from .conv import PerturbedConv1d, PerturbedConv2d, PerturbedConv3d
from .drawing import unshared
from .layout import Cached, compute_dtype, rows_view
from .linear import PerturbedLinear

NOISE_ON = ("latent", "quantized")
"""Where a low-bit layer's noise goes: on the float latents (then quantised) or on the quantised weights."""


def check_low_bit_options(bits: int | None, noise_on: str = "latent", act_bits: int | None = None,
                          hint: str = "pass bits=1 or bits=8 with it") -> None:
    """The one statement of the low-bit options' rules: ``noise_on`` and ``act_bits`` apply with ``bits``
    only; ``hint`` says how to add bits where the options come from (convert's arguments, the CLI's flags)."""
    if bits is not None:
        check_bits(bits)
        if noise_on not in NOISE_ON:
            raise ValueError(f"noise_on must be one of {list(NOISE_ON)}; got {noise_on!r}")
    elif noise_on != "latent" or act_bits is not None:
        option = f"act_bits={act_bits!r}" if act_bits is not None else f"noise_on={noise_on!r}"
        raise ValueError(f"{option} applies to low-bit layers; {hint}")
    if act_bits is not None and (isinstance(act_bits, bool) or act_bits != 8):
        raise ValueError(f"act_bits must be None (float activations) or 8; got {act_bits!r}")


def _members(t: torch.Tensor, signs: int) -> torch.Tensor:
    """(R, D, ...) rows -> (R / signs, signs * D, ...): the rows of one sign and direction, i.e. of one
    member's weights, side by side on the second dimension."""
    r, d = t.shape[:2]
    return t.view(signs, r // signs, d, *t.shape[2:]).transpose(0, 1).reshape(r // signs, signs * d, *t.shape[2:])


def _rows(t: torch.Tensor, signs: int, d: int) -> torch.Tensor:
    """The inverse of :func:`_members`: (R / signs, signs * D, ...) -> (R, D, ...)."""
    q = t.shape[0]
    return t.view(q, signs, d, *t.shape[2:]).transpose(0, 1).reshape(q * signs, d, *t.shape[2:])


class _LowBit:
    """What the low-bit Linear and convolutions share: the quantised weight and the members' weights."""

    weight: nn.Parameter

    def _init_lowbit(self, bits: int, noise_on: str, act_bits: int | None = None) -> None:
        self.bits = check_bits(bits)
        check_low_bit_options(self.bits, noise_on, act_bits)
        self.noise_on, self.act_bits = noise_on, act_bits
        self._members_cache = None
        self._members_buffer: torch.Tensor | None = None

    def quantized_weight(self) -> torch.Tensor:
        """Q(weight): the low-bit weight the plain forward uses (dequantised to the weight's dtype)."""
        return quantize(self.weight, self.bits, self.weight.dim() - 1)

    def set_noise(self, *args, **kwargs) -> None:
        self._members_cache = None  # the members' weights of the old noise are stale (and free them first)
        super().set_noise(*args, **kwargs)

    def free_memory(self) -> None:
        self._members_cache = self._members_buffer = None
        super().free_memory()

    def _signs(self) -> int:
        """How many distinct weights each direction has: 2 with antithetic sampling (+sigma, -sigma), else 1."""
        if self.perturbation.active is None:
            raise ValueError(f"{type(self).__name__}: the members' weights exist in a population call only; call "
                             f"it inside PerturbedModel.perturbing()")
        return 2 if self.perturbation.active.antithetic else 1

    def noise_bytes(self) -> int:
        """The noise tensors' memory plus, with latent noise, what a forward adds per direction: the members'
        low-bit weights (two signs) and a dense copy of the noise (an upper bound; what --chunk-size auto
        plans with)."""
        base = super().noise_bytes()
        noise = self.noise_record("weight")
        if self.noise_on != "latent" or noise is None:
            return base
        return base + 3 * noise.directions * self.weight.numel() * self.weight.element_size()

    def member_weights(self, dtype: torch.dtype) -> torch.Tensor | None:
        """Q(theta + sigma s z_d) for each sign s and local direction d: (signs * D, *weight.shape), sign
        major, in ``dtype``; None when the weight is frozen. Built in the weight's dtype (the quantisation
        sees the fp32 latents under autocast), kept while noise, sigma and weight stay the same, and written
        into the last step's buffer when nothing else holds it (a fresh multi-MB tensor costs more in page
        faults than the arithmetic)."""
        with self.own_call():
            return self._member_weights(dtype)

    def _member_weights(self, dtype: torch.dtype) -> torch.Tensor | None:
        noise = self.noise_of("weight", self.weight.dtype)
        if noise is None:
            return None
        signs = self._signs()
        w = self.weight
        key = (noise, w.data_ptr(), w._version, self.perturbation.active.sigma, signs, dtype, w.device)
        cached = self._members_cache
        if cached is not None and cached.key[0] is noise and cached.key[1:] == key[1:]:
            return cached.value
        self._members_cache = None
        w = self.weight.detach()
        z = self.slot_of("weight").kind.dense(noise).reshape(noise.directions, *w.shape)
        shape = (signs, noise.directions, *w.shape)
        buffer = self._members_buffer
        if buffer is None or buffer.shape != shape or buffer.dtype != w.dtype or buffer.device != w.device \
                or not unshared(buffer):
            self._members_buffer = buffer = None  # free it before allocating its successor
            self._members_buffer = buffer = torch.empty(shape, dtype=w.dtype, device=w.device)
        sign = torch.tensor([1.0, -1.0][:signs], dtype=w.dtype, device=w.device).mul_(self.perturbation.active.sigma)
        torch.addcmul(w.unsqueeze(0).unsqueeze(0), sign.view(signs, *([1] * z.dim())), z.unsqueeze(0), out=buffer)
        quantize(buffer, self.bits, w.dim() - 1, out=buffer)
        members = buffer.flatten(0, 1).to(dtype)
        self._members_cache = Cached(key, members)
        return members

    def _latent_product(self, op: Op, x_rows: torch.Tensor, groups: int) -> torch.Tensor | None:
        """y (R, D, ...) of x (R, D, ...) through each member's own low-bit weight, or None when frozen."""
        members = self.member_weights(x_rows.dtype)
        if members is None:
            return None
        signs, d = self._signs(), x_rows.shape[1]
        if isinstance(op, LinearOp):  # a batched GEMM per member, on strided views where possible
            r, m, n_in = x_rows.shape[0], x_rows.shape[2], x_rows.shape[3]
            w = members.view(signs, d, -1, n_in).transpose(-1, -2)  # (signs, D, in, out)
            x_m = x_rows.view(signs, r // signs, d, m, n_in).permute(0, 2, 1, 3, 4)  # (signs, D, R/signs, M, in)
            if m == 1:
                y = torch.matmul(x_m.squeeze(3), w)  # (signs, D, R/signs, out)
            else:
                y = torch.matmul(x_m.reshape(signs, d, r // signs * m, n_in), w)
            return y.view(signs, d, r // signs, m, -1).permute(0, 2, 1, 3, 4).reshape(r, d, m, -1)
        return _rows(op.per_direction(_members(x_rows, signs), members, groups), signs, d)

    def extra_repr(self) -> str:
        act = "" if self.act_bits is None else f", act_bits={self.act_bits}"
        return f"{super().extra_repr()}, bits={self.bits}, noise_on={self.noise_on!r}{act}"


class LowBitLinear(_LowBit, PerturbedLinear):
    """nn.Linear with binary or int8 weights (per-output-channel scales) quantised from float latents.

    Args:
        in_features, out_features, bias, device, dtype: as for :class:`torch.nn.Linear`.
        bits: 1 (binary: alpha_o * sign) or 8 (symmetric int8, per-output-channel scale).
        noise_on: "latent" (members are Q(theta + noise)) or "quantized" (members are Q(theta) + noise).
        act_bits: None (float inputs) or 8: each input row is quantised to int8 codes with one scale
            (max abs / 127) before the product, and the shared low-bit product runs as an int8 GEMM with
            int32 accumulation (:func:`nesgpu.quantize.int8_linear`); the noise products see the same
            quantised input, in float.
        kind, directions, **options: the noise kind, as for :class:`PerturbedLinear`.

    Example:
        >>> layer = LowBitLinear(64, 32, bits=1, kind="gaussian", directions=16)
        >>> layer.quantized_weight().abs().unique(dim=1).shape   # one magnitude per output channel
        torch.Size([32, 1])
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, bits=1,
                 noise_on="latent", act_bits=None, kind="gaussian", directions=None, **options):
        super().__init__(in_features, out_features, bias, device, dtype, kind=make_kind(kind, **options),
                         directions=directions)
        self._init_lowbit(bits, noise_on, act_bits)
        self._codes_cache = None

    def forward(self, x):
        if self.perturbation.active is None:
            return self._shared_base(x)[1]
        with self.own_call():
            return self.population_forward(x)

    def _shared_base(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the input the noise products see, the shared low-bit product with the bias). With act_bits=8 the
        input is quantised per row first and the product is an int8 GEMM of the codes."""
        if self.act_bits is None:
            return x, F.linear(x, self.quantized_weight(), self.bias)
        x_codes, x_scales = codes(x, 8, 1)
        wt_codes, w_scales = self.weight_codes()
        dtype = compute_dtype(x)
        y = int8_linear(x_codes, x_scales, wt_codes, w_scales, self.bias, dtype)
        return x_codes.to(dtype).mul_(x_scales.to(dtype)), y

    def weight_codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight's int8 codes transposed to (in, out), contiguous (what the int8 GEMM reads), and its
        per-channel scales (see :func:`nesgpu.quantize.codes`); kept while the weight stays the same (an RL
        rollout calls the layer hundreds of times per step)."""
        w = self.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        if self._codes_cache is None or self._codes_cache[0] != key:
            w_codes, w_scales = codes(w.detach(), self.bits, 1)
            self._codes_cache = (key, (w_codes.t().contiguous(), w_scales))
        return self._codes_cache[1]

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the products see it: with act_bits=8, its per-row int8 quantisation."""
        return x if self.act_bits is None else quantize(x, 8, 1)

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.noise_on == "quantized":
            return super().population_forward(x)
        if x.dim() < 2 or x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__}: expected input of shape (repeats * directions, ..., "
                             f"{self.in_features}); got {tuple(x.shape)}")
        dtype = compute_dtype(x)
        pop = self.population_of(x.shape[0], dtype, x.device)
        x4 = rows_view(self._input(x).to(dtype), pop.repeats, pop.directions)
        y4 = self._latent_product(LINEAR, x4, 1)
        if y4 is None:  # a frozen weight: the plain low-bit product
            y4 = F.linear(x4, self.quantized_weight().to(dtype))
        y4 = y4.contiguous()
        if self.bias is not None:
            y4.add_(self.bias.to(dtype))
            self.add_vector_("bias", LINEAR, y4, pop.scale)
        return y4.view(*x.shape[:-1], self.out_features)

    def population_forward_shared(self, x: torch.Tensor, signs: int) -> torch.Tensor:
        if self.noise_on == "quantized":
            return super().population_forward_shared(x, signs)
        if x.dim() != 2 or x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__}: expected a shared input of shape (samples, {self.in_features}); "
                             f"got {tuple(x.shape)}")
        bsz, d, dtype = x.shape[0], self.local_directions, compute_dtype(x)
        pop = self.population_of(signs * bsz * d, dtype, x.device)
        members = self.member_weights(dtype)
        x = self._input(x)
        if members is None:
            y = F.linear(x, self.quantized_weight()).view(1, bsz, 1, -1).expand(signs, bsz, d, -1).contiguous()
        else:  # every member's weights stacked as one (signs * D * out, in) matrix: a single GEMM
            y = x.to(dtype) @ members.view(-1, self.in_features).t()  # (B, signs * D * out)
            y = y.view(bsz, signs, d, -1).transpose(0, 1).contiguous()
        if self.bias is not None:
            y4 = y.view(signs * bsz, d, 1, -1)
            y4.add_(self.bias.to(y4.dtype))
            self.add_vector_("bias", LINEAR, y4, pop.scale)
        return y.view(-1, self.out_features)


class _LowBitConv(_LowBit):
    """Construction and population forward of the low-bit convolutions (mixed into a PerturbedConvNd)."""

    def __init__(self, *args, bits=1, noise_on="latent", **kwargs):
        super().__init__(*args, **kwargs)
        self._init_lowbit(bits, noise_on)

    def _base_weight(self) -> torch.Tensor:
        """The kernel of the shared product: the quantised one (PerturbedConvNd's hook)."""
        return self.quantized_weight()

    def forward(self, x):
        if self.perturbation.active is None:
            return self._conv_forward(x, self.quantized_weight(), self.bias)
        with self.own_call():
            return self.population_forward(x)

    def population_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.noise_on == "quantized":
            return super().population_forward(x)
        self.check_input(x)
        dtype = compute_dtype(x)
        pop = self.population_of(x.shape[0], dtype, x.device)
        x_rows = x.to(dtype).view(pop.repeats, pop.directions, *x.shape[1:])
        y_rows = self._latent_product(self.op, x_rows, self.groups)
        if y_rows is None:
            y = self._conv_forward(x, self.quantized_weight(), None).to(dtype)
            y_rows = y.view(pop.repeats, pop.directions, *y.shape[1:])
        y_rows = y_rows.contiguous()
        if self.bias is not None:
            y_rows.add_(self.op.per_channel(self.bias.to(dtype).unsqueeze(0), y_rows))
            self.add_vector_("bias", self.op, y_rows, pop.scale)
        return y_rows.view(x.shape[0], *y_rows.shape[2:])


class LowBitConv1d(_LowBitConv, PerturbedConv1d):
    """nn.Conv1d with binary or int8 kernels (per-output-channel scales) quantised from float latents.

    Args:
        as for :class:`nesgpu.layers.PerturbedConv1d`, plus ``bits`` (1 or 8) and ``noise_on`` ("latent" or
        "quantized").
    """


class LowBitConv2d(_LowBitConv, PerturbedConv2d):
    """nn.Conv2d with binary or int8 kernels (per-output-channel scales) quantised from float latents: as
    :class:`LowBitConv1d`."""


class LowBitConv3d(_LowBitConv, PerturbedConv3d):
    """nn.Conv3d with binary or int8 kernels (per-output-channel scales) quantised from float latents: as
    :class:`LowBitConv1d`."""
