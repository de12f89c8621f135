"""Low-bit layers: the quantisers, the population forward against a dense per-member float64 reference of the
same quantised forward (both noise placements, every kind), the estimator contract, and bad input."""

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, randomize_
from torch import nn

import nesgpu
from nesgpu.layers.sequential import shared_entry
from nesgpu.quantize import codes, quantize

SIGMA = 0.3
KINDS = [("gaussian", {}), ("lowrank", {"rank": 2}), ("flipout", {}), ("permuted", {}), ("sparse", {"k": 3})]
CONV_KINDS = [k for k in KINDS if k[0] != "sparse"]
MODES = ["latent", "quantized"]


# ----- the quantisers ----------------------------------------------------------------------------------
def test_binary_is_plus_minus_the_mean_magnitude_per_channel():
    w = torch.randn(5, 7, dtype=torch.float64)
    w[2, 3] = 0.0
    q = quantize(w, 1, 1)
    alpha = w.abs().mean(1, keepdim=True)
    torch.testing.assert_close(q, torch.where(w >= 0, alpha, -alpha), rtol=1e-15, atol=0)
    assert q[2, 3] > 0  # sign(+0.0) = +1
    assert quantize(torch.tensor([[-0.0, 2.0]]), 1, 1).tolist() == [[-1.0, 1.0]]  # the sign bit: -0.0 is negative
    c, s = codes(w, 1, 1)
    assert c.dtype == torch.int8 and set(c.unique().tolist()) == {-1, 1}
    torch.testing.assert_close(c.double() * s, q, rtol=0, atol=0)


def test_int8_rounds_to_the_channel_grid():
    w = torch.randn(6, 4, 3, dtype=torch.float64)  # a Conv1d kernel: channel values over (in, kernel)
    w[1] = 0.0
    q = quantize(w, 8, 2)
    c, s = codes(w, 8, 2)
    assert s.shape == (6, 1, 1) and s[1].item() == 1.0  # an all-zero channel keeps scale 1
    assert c.abs().amax((1, 2)).tolist() == [127, 0, 127, 127, 127, 127]  # the largest entry maps to +-127
    torch.testing.assert_close(c.double() * s, q, rtol=0, atol=0)
    assert ((q - w).abs() <= s / 2 + 1e-15).all()  # round to nearest
    assert q[1].abs().sum() == 0


@pytest.mark.parametrize("bits, error", [(2, ValueError), (4, ValueError), (True, TypeError), ("8", TypeError),
                                         (8.0, TypeError)])
def test_unsupported_bit_widths_are_refused(bits, error):
    with pytest.raises(error, match=r"bits must be .*\[1, 8\]"):
        quantize(torch.randn(2, 2), bits, 1)
    with pytest.raises(error, match=r"\[1, 8\]"):
        nesgpu.convert(nn.Linear(2, 2), "gaussian", bits=bits)


# ----- the population forward against the dense reference ----------------------------------------------
def member_weight(theta, z_d, s, bits, mode, channel_dims):
    if mode == "latent":
        return quantize(theta + s * z_d, bits, channel_dims)
    return quantize(theta, bits, channel_dims) + s * z_d


def reference(layer, x, z, repeats, directions, antithetic, bits, mode, apply, sigma=SIGMA):
    rows = []
    for n in range(repeats * directions):
        r, d = divmod(n, directions)
        s = sigma * (-1.0 if antithetic and r >= repeats // 2 else 1.0)
        w = member_weight(layer.weight, z["weight"][d], s, bits, mode, layer.weight.dim() - 1)
        b = None if layer.bias is None else layer.bias + s * z["bias"][d]
        rows.append(apply(x[n:n + 1], w, b))
    return torch.cat(rows)


@pytest.mark.parametrize("kind, options", KINDS, ids=[k[0] for k in KINDS])
@pytest.mark.parametrize("bits", [1, 8])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("antithetic", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_linear_matches_the_dense_quantised_reference(kind, options, bits, mode, antithetic, device):
    if kind == "permuted" and not antithetic:
        pytest.skip("the permuted kind is refused without antithetic pairs")
    directions, repeats = 5, 4
    layer = randomize_(nn.Linear(7, 6, dtype=torch.float64))
    layer = nesgpu.convert(layer, kind, bits=bits, noise_on=mode, **options).to(device)
    assert isinstance(layer, nesgpu.LowBitLinear) and (layer.bits, layer.noise_on) == (bits, mode)
    pm = nesgpu.PerturbedModel(layer, directions, sigma=SIGMA, antithetic=antithetic, seed=3)
    pm.set_noise()
    x = torch.randn(repeats * directions, 3, 7, dtype=torch.float64, device=device)  # 3 positions per row
    expected = reference(layer, x, pm.dense_noise(), repeats, directions, antithetic, bits, mode, F.linear)
    torch.testing.assert_close(pm(x), expected, rtol=1e-12, atol=1e-12)
    # the plain forward is the quantised layer
    torch.testing.assert_close(layer(x), F.linear(x, quantize(layer.weight, bits, 1), layer.bias), rtol=0, atol=0)


@pytest.mark.parametrize("bits", [1, 8])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("antithetic", [True, False])
def test_shared_input_equals_the_rows_it_stands_for(bits, mode, antithetic):
    net = randomize_(nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double())
    net = nesgpu.convert(net, "lowrank", bits=bits, noise_on=mode)
    pm = nesgpu.PerturbedModel(net, 4, sigma=SIGMA, antithetic=antithetic, seed=2)
    pm.set_noise()
    assert shared_entry(pm.model) is not None  # the low-bit Linear takes the one-GEMM shared-input path
    x = torch.randn(5, 6, dtype=torch.float64)
    signs = 2 if antithetic else 1
    rows = x.unsqueeze(0).unsqueeze(2).expand(signs, 5, 4, 6).reshape(-1, 6)
    torch.testing.assert_close(pm.shared_input(x), pm(rows), rtol=1e-12, atol=1e-12)


CONVS = [
    (nn.Conv1d, dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, groups=2), (9,)),
    (nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=(3, 2), stride=2, bias=False), (7, 6)),
    (nn.Conv2d, dict(in_channels=4, out_channels=4, kernel_size=3, padding=1, padding_mode="reflect"), (5, 5)),
]


@pytest.mark.parametrize("conv", CONVS, ids=["conv1d-groups", "conv2d-nobias", "conv2d-reflect"])
@pytest.mark.parametrize("kind, options", CONV_KINDS, ids=[k[0] for k in CONV_KINDS])
@pytest.mark.parametrize("bits", [1, 8])
@pytest.mark.parametrize("mode", MODES)
def test_conv_matches_the_dense_quantised_reference(conv, kind, options, bits, mode):
    cls, args, spatial = conv
    directions, repeats = 3, 4
    layer = randomize_(cls(**args, dtype=torch.float64))
    layer = nesgpu.convert(layer, kind, bits=bits, noise_on=mode, **options)
    assert type(layer).__name__ == f"LowBit{cls.__name__}"
    pm = nesgpu.PerturbedModel(layer, directions, sigma=SIGMA, antithetic=True, seed=4)
    pm.set_noise()
    x = torch.randn(repeats * directions, args["in_channels"], *spatial, dtype=torch.float64)

    def apply(x, w, b):
        return layer._conv_forward(x, w, b)

    expected = reference(layer, x, pm.dense_noise(), repeats, directions, True, bits, mode, apply)
    torch.testing.assert_close(pm(x), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer(x), apply(x, quantize(layer.weight, bits, layer.weight.dim() - 1), layer.bias),
                               rtol=0, atol=0)


def test_members_follow_the_weights_after_an_optimizer_step():
    """The members' low-bit weights are kept between calls (an RL rollout's hundreds of forwards); a change of
    the latent weights, of sigma or of the noise must rebuild them."""
    layer = nesgpu.convert(randomize_(nn.Linear(5, 4, dtype=torch.float64)), "gaussian", bits=8)
    pm = nesgpu.PerturbedModel(layer, 3, sigma=SIGMA, antithetic=True)
    pm.set_noise()
    x = torch.randn(6, 5, dtype=torch.float64)

    def expected():
        return reference(layer, x, pm.dense_noise(), 2, 3, True, 8, "latent", F.linear)

    torch.testing.assert_close(pm(x), expected(), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        layer.weight.mul_(1.7)  # what optimizer.step() does: an in-place change
    torch.testing.assert_close(pm(x), expected(), rtol=1e-12, atol=1e-12)
    pm.sigma = 0.05
    torch.testing.assert_close(pm(x), reference(layer, x, pm.dense_noise(), 2, 3, True, 8, "latent", F.linear,
                                                sigma=0.05), rtol=1e-12, atol=1e-12)
    pm.sigma = SIGMA
    pm.set_noise()
    torch.testing.assert_close(pm(x), expected(), rtol=1e-12, atol=1e-12)


def test_frozen_weight_uses_the_plain_quantised_weight():
    net = randomize_(nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 2)).double())
    net = nesgpu.convert(net, "gaussian", bits=1, freeze=["0.weight"])
    pm = nesgpu.PerturbedModel(net, 3, sigma=SIGMA, antithetic=True)
    pm.set_noise()
    assert "weight" not in net[0].perturbed_parameters()
    x = torch.randn(6, 5, dtype=torch.float64)
    z = pm.dense_noise()
    h = []
    for n in range(6):
        r, d = divmod(n, 3)
        s = SIGMA * (1 if r == 0 else -1)
        a = F.linear(x[n], quantize(net[0].weight, 1, 1), net[0].bias + s * z["0.bias"][d])
        h.append(F.linear(a, quantize(net[1].weight + s * z["1.weight"][d], 1, 1), net[1].bias + s * z["1.bias"][d]))
    torch.testing.assert_close(pm(x), torch.stack(h), rtol=1e-12, atol=1e-12)


def test_bf16_autocast_quantises_the_fp32_latents():
    torch.manual_seed(0)
    net = nesgpu.convert(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)), "lowrank", bits=8)
    pm = nesgpu.PerturbedModel(net, 8, sigma=0.05, antithetic=True)
    pm.set_noise()
    x = torch.randn(32, 16)
    full = pm(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = pm(x)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), full, rtol=0.05, atol=0.05)


# ----- the estimator -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_update_is_the_kinds_estimate_and_chunks_add_up(mode):
    net = randomize_(nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Conv1d(1, 2, 3)).double())
    net = nn.Sequential(net[0], net[1], nn.Unflatten(1, (1, 4)), net[2])
    net = nesgpu.convert(net, "lowrank", bits=1, noise_on=mode)
    pm = nesgpu.PerturbedModel(net, 6, sigma=SIGMA, antithetic=True)
    pm.set_noise(step=1)
    z = pm.dense_noise()
    w = torch.randn(2, 6, dtype=torch.float64)
    pm.update(w)
    whole = {n: p.grad.clone() for n, p in net.named_parameters()}
    coef = (w[0] - w[1]) / 2 / (6 * SIGMA)
    for name, g in whole.items():
        torch.testing.assert_close(g, torch.tensordot(coef, z[name], dims=1), rtol=1e-12, atol=1e-12)
    net.zero_grad(set_to_none=True)
    for block in (range(0, 4), range(4, 6)):
        pm.set_noise(step=1, directions=block)
        pm.update(w[:, block.start:block.stop])
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.grad, whole[name], rtol=1e-12, atol=1e-12)


def test_quantized_noise_estimates_the_gradient_at_the_low_bit_weights():
    """noise_on="quantized": for a fitness linear in the member's weights, the ES estimate is unbiased for the
    gradient at W = Q(theta) (what a straight-through estimator would use), checked against autograd."""
    torch.manual_seed(0)
    layer = nesgpu.convert(randomize_(nn.Linear(4, 3, dtype=torch.float64)), "gaussian", bits=1,
                           noise_on="quantized")
    x, c = torch.randn(4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    w = quantize(layer.weight.detach(), 1, 1).requires_grad_(True)
    b = layer.bias.detach().clone().requires_grad_(True)
    (c @ F.linear(x, w, b)).backward()
    directions = 20000
    pm = nesgpu.PerturbedModel(layer, directions, sigma=0.1, antithetic=True, seed=5)
    pm.set_noise()
    fitness = pm(x.expand(2 * directions, 4)) @ c  # (2 D,)
    pm.update(fitness.view(2, directions))
    torch.testing.assert_close(layer.weight.grad, w.grad, rtol=0, atol=0.05)
    torch.testing.assert_close(layer.bias.grad, b.grad, rtol=0, atol=0.05)


# ----- convert ------------------------------------------------------------------------------------------
def test_convert_keeps_state_dict_and_refuses_modules_without_a_low_bit_version():
    net = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    net = nesgpu.convert(net, "lowrank", bits=8)
    assert net.state_dict().keys() == before.keys()
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert type(net[1]).__name__ == "PerturbedLayerNorm"  # norm parameters stay float, perturbed elementwise
    with pytest.raises(ValueError, match=r"bits=1: 0 \(Embedding\) has no low-bit version.*freeze"):
        nesgpu.convert(nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 2)), "lowrank", bits=1)
    with pytest.raises(ValueError, match=r"bits=8: 0 \(LSTM\) has no low-bit version"):
        nesgpu.convert(nn.Sequential(nn.LSTM(4, 4)), "lowrank", bits=8)

    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.s

    with pytest.raises(ValueError, match=r"bits=1: 1 \(Scale\) would need the torch.func fallback"):
        nesgpu.convert(nn.Sequential(nn.Linear(3, 3), Scale()), "lowrank", bits=1)
    # a frozen Embedding is fine: nothing of it is perturbed or quantised
    net = nesgpu.convert(nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 2)), "lowrank", bits=1, freeze=["0"])
    assert isinstance(net[1], nesgpu.LowBitLinear) and isinstance(net[0], nn.Embedding)


def test_bad_noise_placement_is_refused():
    with pytest.raises(ValueError, match=r"noise_on must be one of \['latent', 'quantized'\]; got 'weights'"):
        nesgpu.convert(nn.Linear(2, 2), "gaussian", bits=1, noise_on="weights")
    with pytest.raises(ValueError, match="noise_on=.quantized. applies to low-bit layers; pass bits"):
        nesgpu.convert(nn.Linear(2, 2), "gaussian", noise_on="quantized")
    with pytest.raises(ValueError, match="noise_on must be one of"):
        nesgpu.LowBitLinear(2, 2, bits=8, noise_on="both")


def test_members_held_by_a_caller_are_not_overwritten_by_the_next_step():
    layer = nesgpu.convert(randomize_(nn.Linear(5, 4, dtype=torch.float64)), "lowrank", bits=8)
    pm = nesgpu.PerturbedModel(layer, 3, sigma=SIGMA, antithetic=True)
    x = torch.randn(6, 5, dtype=torch.float64)
    pm.set_noise()
    with pm.perturbing():
        held = layer.member_weights(torch.float64)
        layer(x)
    copy = held.clone()
    for _ in range(2):  # the buffer is reused across steps only while nothing else holds it
        pm.set_noise()
        torch.testing.assert_close(pm(x), reference(layer, x, pm.dense_noise(), 2, 3, True, 8, "latent", F.linear),
                                   rtol=1e-12, atol=1e-12)
    assert torch.equal(held, copy)


# ----- int8 activations: the shared product as an int8 GEMM ----------------------------------------------
@pytest.mark.parametrize("kind, options", KINDS[:2], ids=[k[0] for k in KINDS[:2]])
@pytest.mark.parametrize("bits", [1, 8])
@pytest.mark.parametrize("mode", MODES)
def test_int8_activations_match_the_dense_reference(kind, options, bits, mode):
    """act_bits=8: every member multiplies the per-row int8 quantisation of its input by its weights."""
    directions, repeats = 4, 4
    layer = randomize_(nn.Linear(16, 8, dtype=torch.float64))
    layer = nesgpu.convert(layer, kind, bits=bits, noise_on=mode, act_bits=8, **options)
    pm = nesgpu.PerturbedModel(layer, directions, sigma=SIGMA, antithetic=True, seed=3)
    pm.set_noise()
    x = torch.randn(repeats * directions, 3, 16, dtype=torch.float64)

    def apply(x, w, b):
        return F.linear(quantize(x, 8, 1), w, b)

    expected = reference(layer, x, pm.dense_noise(), repeats, directions, True, bits, mode, apply)
    torch.testing.assert_close(pm(x), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(layer(x), apply(x, quantize(layer.weight, bits, 1), layer.bias), rtol=1e-12, atol=1e-12)
    xs = torch.randn(5, 16, dtype=torch.float64)
    rows = xs.unsqueeze(0).unsqueeze(2).expand(2, 5, directions, 16).reshape(-1, 16)
    torch.testing.assert_close(pm.shared_input(xs), pm(rows), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_int8_gemm_equals_the_exact_product_of_the_codes(device, monkeypatch):
    from nesgpu.quantize import codes, int8_linear

    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=gen) for shape in ((40, 3, 64), (24, 64), (24,)))
    xc, xs = codes(x, 8, 1)
    wc, ws = codes(w, 8, 1)
    wt = wc.t().contiguous()
    exact = int8_linear(xc.double(), xs.double(), wt.double(), ws.double(), b.double(), torch.float64)
    assert exact.shape == (40, 3, 24)
    torch.testing.assert_close(exact, F.linear(xc.double() * xs.double(), wc.double() * ws.double(), b.double()),
                               rtol=1e-12, atol=1e-12)
    calls, int_mm = [], torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: (calls.append(a.shape), int_mm(a, b))[1])
    fast = int8_linear(*(t.to(device) for t in (xc, xs, wt, ws, b)), torch.float32)
    assert calls == [(120, 64)]  # the int8 GEMM ran (not the float fallback)
    torch.testing.assert_close(fast.double().cpu(), exact, rtol=1e-6, atol=1e-6)


def test_int8_fallback_is_exact_under_fp16_autocast(monkeypatch):
    """Where the device has no int8 GEMM, the codes' float product runs outside autocast: fp16 would overflow
    on sums of up to in * 127^2."""
    from nesgpu.quantize import codes, int8_linear

    def no_int_mm(a, b):
        raise RuntimeError("no int8 GEMM here (simulated)")

    monkeypatch.setattr(torch, "_int_mm", no_int_mm)
    x = torch.full((20, 64), 3.0)
    w = torch.full((10, 64), 2.0)
    xc, xs = codes(x, 8, 1)
    wc, ws = codes(w, 8, 1)
    with torch.autocast("cpu", dtype=torch.float16):
        y = int8_linear(xc, xs, wc.t().contiguous(), ws, None, torch.float16)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), torch.full((20, 10), 384.0), rtol=1e-3, atol=0)  # 64 * 3 * 2


def test_int8_activations_in_float32_take_the_int8_gemm_and_match_the_reference(monkeypatch):
    calls, int_mm = [], torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: (calls.append(a.shape), int_mm(a, b))[1])
    layer = nesgpu.convert(randomize_(nn.Linear(32, 16)), "lowrank", bits=8, noise_on="quantized", act_bits=8)
    pm = nesgpu.PerturbedModel(layer, 4, sigma=SIGMA, antithetic=True, seed=1)
    pm.set_noise()
    x = torch.randn(8, 32)
    out = pm(x)
    assert calls == [(8, 32)]
    expected = reference(layer.double(), x.double(), {k: v.double() for k, v in pm.dense_noise().items()}, 2, 4, True,
                         8, "quantized", lambda x, w, b: F.linear(quantize(x, 8, 1), w, b))
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)


def test_int8_activations_are_refused_where_they_do_not_apply():
    with pytest.raises(ValueError, match=r"act_bits=8: 0 \(Conv1d\) has no int8-activation version"):
        nesgpu.convert(nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(4, 2)), "lowrank", bits=8,
                       act_bits=8)
    with pytest.raises(ValueError, match="act_bits must be None .* or 8; got 4"):
        nesgpu.convert(nn.Linear(2, 2), "gaussian", bits=8, act_bits=4)
    with pytest.raises(ValueError, match="act_bits=8 applies to low-bit layers; pass bits"):
        nesgpu.convert(nn.Linear(2, 2), "gaussian", act_bits=8)


def test_int8_weight_codes_follow_the_weights():
    layer = nesgpu.convert(randomize_(nn.Linear(16, 8)), "lowrank", bits=1, act_bits=8)
    x = torch.randn(20, 16)

    def expected():
        return F.linear(quantize(x, 8, 1), quantize(layer.weight, 1, 1), layer.bias)

    torch.testing.assert_close(layer(x), expected(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        layer.weight.neg_()  # in place, as optimizer.step()
    torch.testing.assert_close(layer(x), expected(), rtol=1e-5, atol=1e-5)
    layer.weight.data = torch.randn(8, 16)  # a new tensor
    torch.testing.assert_close(layer(x), expected(), rtol=1e-5, atol=1e-5)


def test_a_frozen_linear_is_low_bit_too_and_only_latent_noise_adds_member_memory():
    net = nesgpu.convert(randomize_(nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 2))), "lowrank", bits=1, freeze=["0"])
    assert isinstance(net[0], nesgpu.LowBitLinear) and not net[0].perturbs  # quantised, not evolved
    x = torch.randn(3, 6)
    torch.testing.assert_close(net[0](x), F.linear(x, quantize(net[0].weight, 1, 1), net[0].bias))
    pm = nesgpu.PerturbedModel(net, 4, sigma=SIGMA, antithetic=True)
    pm.set_noise()
    assert pm(torch.randn(8, 6)).shape == (8, 2)
    noise = sum(t.numel() * t.element_size() for t in net[1].noise_record("weight").tensors.values())
    noise += sum(t.numel() * t.element_size() for t in net[1].noise_record("bias").tensors.values())
    assert net[1].noise_bytes() == noise + 3 * 4 * 10 * 4  # two signs' members and a dense z: 3 x D x numel
    quantized = nesgpu.convert(nn.Linear(5, 2), "lowrank", bits=1, noise_on="quantized")
    nesgpu.PerturbedModel(quantized, 4, sigma=SIGMA).set_noise()
    assert quantized.noise_bytes() == sum(t.numel() * t.element_size() for n in ("weight", "bias")
                                          for t in quantized.noise_record(n).tensors.values())
    with pytest.raises(ValueError, match="members' weights exist in a population call only"):
        net[1].member_weights(torch.float32)
