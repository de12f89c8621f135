"""Every kind registered in ``nesgpu.kinds.KINDS``, with its default options, keeps the Kind contract, so a new
kind is tested by being registered: its products, estimate and squared norms equal the same sums over its dense
z_d in float64, its draws are a function of the generator alone (filled in place or drawn fresh), and a population
of PerturbedLinear / PerturbedConv2d layers of it is exact against a per-member dense reference."""

import pytest
import torch
from conftest import randomize_
from test_forward import SIGMA, reference_rows  # tests/kinds is on sys.path

import nesgpu
from nesgpu.kinds import KINDS, LINEAR, ConvOp, Geometry, Noise, make_kind

NAMES = sorted(KINDS)
D = 5
LINEAR_GEOMETRY = Geometry(6, 7)
CONV_GEOMETRY = Geometry(6, 4, groups=2, kernel=(3, 2))
CONV = ConvOp(2, (1, 1), (1, 1), (1, 1))


def record(kind, geometry, seed=0):
    """D directions' noise of a float64 parameter of ``geometry``, drawn as a layer draws it."""
    gen = torch.Generator().manual_seed(seed)
    like = torch.zeros(geometry.shape, dtype=torch.float64)
    tensors = {**kind.draw_shared(gen, geometry, like), **kind.draw_directions(gen, D, geometry, like)}
    return Noise(geometry, geometry.shape, tensors, D)


def geometries(kind):
    return [LINEAR_GEOMETRY, CONV_GEOMETRY] if kind.supports("conv") else [LINEAR_GEOMETRY]


@pytest.mark.parametrize("name", NAMES)
def test_a_registered_kind_is_made_by_its_name_with_default_options(name):
    kind = make_kind(name)
    assert type(kind) is KINDS[name] and kind.name == name and str(kind) == name
    assert kind.supports("linear")


@pytest.mark.parametrize("name", NAMES)
def test_estimate_and_squared_norms_are_the_dense_noises(name):
    kind = make_kind(name)
    for geometry in geometries(kind):
        noise = record(kind, geometry)
        z = kind.dense(noise)
        assert z.shape == (D, *geometry.shape) and z.dtype == torch.float64
        coef = torch.linspace(-1, 2, D, dtype=torch.float64)
        torch.testing.assert_close(kind.grad(noise, coef), torch.einsum("d...,d->...", z, coef), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kind.sq_norms(noise), z.pow(2).flatten(1).sum(1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_linear_product_is_the_dense_noises(name):
    kind, scale = make_kind(name), torch.tensor([SIGMA, -SIGMA], dtype=torch.float64)
    noise = record(kind, LINEAR_GEOMETRY)
    z = kind.dense(noise)
    x = torch.randn(2, D, 3, 7, dtype=torch.float64)  # (R, D, M, in)
    bias_z = torch.randn(D, 6, dtype=torch.float64)
    y = torch.zeros(2, D, 3, 6, dtype=torch.float64)
    kind.apply_with_bias_(LINEAR, x, y, scale, noise, bias_z)
    expected = scale.view(2, 1, 1, 1) * (torch.einsum("rdmi,doi->rdmo", x, z) + bias_z.view(1, D, 1, 6))
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_conv_product_is_the_dense_noises_or_refused(name):
    kind, scale = make_kind(name), torch.tensor([SIGMA, -SIGMA], dtype=torch.float64)
    if not kind.supports("conv"):
        with pytest.raises(ValueError, match=f"kind '{name}' has no conv product"):
            nesgpu.PerturbedConv2d(4, 6, 3, kind=name)
        return
    noise = record(kind, CONV_GEOMETRY)
    z = kind.dense(noise)
    x = torch.randn(2, D, 4, 5, 6, dtype=torch.float64)  # (R, D, C_in, H, W)
    y = torch.zeros(2, D, 6, 5, 7, dtype=torch.float64)
    kind.apply_(CONV, x, y, scale, noise)
    expected = torch.stack([torch.stack([scale[r] * CONV.conv(x[r, d][None], z[d], None, 2)[0] for d in range(D)])
                            for r in range(2)])
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_draws_are_a_function_of_the_generator_filled_or_drawn(name):
    kind = make_kind(name)
    for geometry in geometries(kind):
        same, other = record(kind, geometry), record(kind, geometry, seed=1)
        assert torch.equal(kind.dense(record(kind, geometry)), kind.dense(same))
        assert not torch.equal(kind.dense(other), kind.dense(same))
        like = torch.zeros(geometry.shape, dtype=torch.float64)
        out = kind.allocate_directions(D, geometry, like)
        if out is None:  # this kind only draws fresh tensors
            continue
        gen = torch.Generator().manual_seed(0)
        kind.draw_shared(gen, geometry, like)  # consumed first, as a layer does
        kind.fill_directions(gen, out, geometry)
        assert out.keys() <= same.tensors.keys() and all(torch.equal(out[k], same.tensors[k]) for k in out)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("antithetic", [False, True])
def test_a_population_of_its_layers_is_exact_in_float64(name, antithetic):
    kind = make_kind(name)
    if kind.needs_antithetic and not antithetic:
        pytest.skip(f"PerturbedModel refuses kind {name!r} without antithetic sampling (its z_d has a mean)")
    layers = [(nesgpu.PerturbedLinear(7, 6, dtype=torch.float64, kind=name), (4 * D, 7),
               lambda layer: torch.nn.functional.linear)]
    if kind.supports("conv"):
        layers.append((nesgpu.PerturbedConv2d(4, 6, 3, padding=1, groups=2, dtype=torch.float64, kind=name),
                       (4 * D, 4, 5, 6), lambda layer: layer._conv_forward))
    for layer, shape, apply in layers:
        pm = nesgpu.PerturbedModel(randomize_(layer), D, sigma=SIGMA, antithetic=antithetic, seed=3)
        pm.set_noise()
        x = torch.randn(shape, dtype=torch.float64)
        expected = reference_rows(layer, x, pm.dense_noise(), 4, D, antithetic, apply(layer))
        torch.testing.assert_close(pm(x), expected, rtol=1e-12, atol=1e-12)
