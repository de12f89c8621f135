"""Each kind's batched population forward equals a plain per-direction F.linear / F.conv2d with
theta + sigma * s_r * z_d, in float64."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    CONV_CASES,
    CONV_GEOMETRIES,
    DEVICES,
    LINEAR_CASES,
    antithetic_or_skip,
    case_id,
    needs_antithetic,
    randomize_,
)

import nesgpu

SIGMA = 0.3


def reference_rows(layer, x, z, repeats, directions, antithetic, apply):
    """Per-row reference: row n = (r, d) through apply(x_n, theta + sigma s_r z_d)."""
    rows = []
    for n in range(repeats * directions):
        r, d = divmod(n, directions)
        s = -1.0 if antithetic and r >= repeats // 2 else 1.0
        w = layer.weight + SIGMA * s * z["weight"][d]
        b = None if layer.bias is None else layer.bias + SIGMA * s * z["bias"][d]
        rows.append(apply(x[n : n + 1], w, b))
    return torch.cat(rows)


@pytest.mark.parametrize("case", LINEAR_CASES, ids=case_id)
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_linear_matches_per_direction_reference(case, antithetic, bias, device):
    cls, options = case
    directions, repeats = 5, 4
    layer = randomize_(cls(7, 6, bias=bias, dtype=torch.float64, **options)).to(device)
    pm = nesgpu.PerturbedModel(layer, directions, sigma=SIGMA, antithetic=antithetic_or_skip(case, antithetic),
                               seed=3)
    pm.set_noise()
    x = torch.randn(repeats * directions, 7, dtype=torch.float64).to(device)
    expected = reference_rows(layer, x, pm.dense_noise(), repeats, directions, antithetic, F.linear)
    torch.testing.assert_close(pm(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", LINEAR_CASES, ids=case_id)
def test_every_position_of_a_row_uses_the_rows_direction(case):
    cls, options = case
    directions = 4
    layer = randomize_(cls(7, 6, dtype=torch.float64, **options))
    pm = nesgpu.PerturbedModel(layer, directions, sigma=SIGMA, antithetic=True)
    pm.set_noise()
    x = torch.randn(2 * directions, 3, 7, dtype=torch.float64)  # (R*D, T, in): a sequence per row
    out = pm(x)
    for t in range(3):  # position t of row n is row n of a population call on position t alone
        torch.testing.assert_close(out[:, t], pm(x[:, t]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CONV_CASES, ids=case_id)
@pytest.mark.parametrize("geometry", CONV_GEOMETRIES, ids=lambda g: str(g[3]) or "plain")
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_conv_matches_per_direction_reference(case, geometry, antithetic, device):
    cls, options = case
    c_in, c_out, kernel, conv_args = geometry
    directions, repeats = 3, 2
    layer = randomize_(cls(c_in, c_out, kernel, dtype=torch.float64, **conv_args, **options)).to(device)
    groups, kernel = conv_args.get("groups", 1), (kernel,) * 2 if isinstance(kernel, int) else kernel
    if options.get("rank", 1) > (c_out // groups) * (c_in // groups) * math.prod(kernel):  # a 1 x 1 depthwise filter
        with pytest.raises(ValueError, match="is more than the entries of any matrix"):
            nesgpu.PerturbedModel(layer, directions, sigma=SIGMA)
        return
    pm = nesgpu.PerturbedModel(layer, directions, sigma=SIGMA, antithetic=antithetic_or_skip(case, antithetic),
                               seed=5)
    pm.set_noise()
    x = torch.randn(repeats * directions, c_in, 7, 6, dtype=torch.float64).to(device)
    expected = reference_rows(layer, x, pm.dense_noise(), repeats, directions, antithetic, layer._conv_forward)
    torch.testing.assert_close(pm(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
def test_alone_layer_is_its_torch_parent(case):
    cls, options = case
    if issubclass(cls, torch.nn.Conv2d):
        layer, parent, x = cls(3, 4, 3, **options), torch.nn.Conv2d(3, 4, 3), torch.randn(2, 3, 5, 5)
    else:
        layer, parent, x = cls(3, 4, **options), torch.nn.Linear(3, 4), torch.randn(2, 3)
    parent.load_state_dict(layer.state_dict())
    pm = nesgpu.PerturbedModel(layer, 2, sigma=1.0, antithetic=needs_antithetic(*case))
    pm.set_noise()  # noise present, but a plain call ignores it
    torch.testing.assert_close(layer(x), parent(x), rtol=0, atol=0)
    assert set(layer.state_dict()) == set(parent.state_dict())  # no noise in checkpoints


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
def test_dense_noise_has_unit_variance(case):
    # Shared-noise kinds correlate the directions of one step, so sample over many steps.
    cls, options = case
    steps, directions = 512, 4
    layer = cls(8, 8, 3, **options) if issubclass(cls, torch.nn.Conv2d) else cls(16, 8, **options)
    pm = nesgpu.PerturbedModel(layer, directions, seed=11, antithetic=needs_antithetic(*case))
    samples = []
    for _ in range(steps):
        pm.set_noise()
        samples.append(pm.dense_noise()["weight"])
    z = torch.stack(samples)  # (steps, D, ...): steps are independent, directions within one may not be
    # every entry has mean 0 and variance 1, within sampling error (z-scores over ~10^3 entries)
    for stat, target in ((z, 0.0), (z.pow(2), 1.0)):
        per_step = stat.mean(1)
        score = (per_step.mean(0) - target) / (per_step.std(0) / steps**0.5)
        assert score.abs().max() < 5.5
