"""Noise is a function of (seed, step, layer, direction) only, and never touches the global RNG."""

import pytest
import torch
from conftest import CONV_CASES, LINEAR_CASES, case_id, needs_antithetic
from torch import nn

import nesgpu
from nesgpu.noise import BLOCK, NoiseSource, derive_seed, random_subsets


def make(case, directions=70, seed=0):
    cls, options = case
    layer = cls(6, 8, 3, **options) if issubclass(cls, nn.Conv2d) else cls(6, 8, **options)
    return nesgpu.PerturbedModel(layer, directions, seed=seed, antithetic=needs_antithetic(*case))


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
def test_direction_noise_does_not_depend_on_range(case):
    pm = make(case)
    pm.set_noise(step=4)
    full = pm.dense_noise()
    for lo, hi in [(0, 1), (3, 40), (31, 33), (64, 70), (0, 70)]:
        pm.set_noise(step=4, directions=range(lo, hi))
        for key, z in pm.dense_noise().items():
            torch.testing.assert_close(z, full[key][lo:hi], rtol=0, atol=0)


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
def test_same_seed_same_noise_and_new_noise_each_step(case):
    a, b, other = make(case), make(case), make(case, seed=1)
    a.set_noise(), b.set_noise(), other.set_noise()
    za, zb, zo = a.dense_noise(), b.dense_noise(), other.dense_noise()
    for key in za:
        torch.testing.assert_close(za[key], zb[key], rtol=0, atol=0)
        assert not torch.equal(za[key], zo[key])
    a.set_noise()
    assert a.step == 2
    for key, z in a.dense_noise().items():
        assert not torch.equal(z, za[key])


def test_layers_of_one_model_get_different_noise():
    net = nesgpu.convert(nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5)), "gaussian")
    pm = nesgpu.PerturbedModel(net, 4)
    pm.set_noise()
    z = pm.dense_noise()
    assert not torch.equal(z["0.weight"], z["1.weight"])


def test_noise_does_not_touch_global_rng():
    net = nesgpu.convert(nn.Sequential(nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 2)), "permuted")
    before = torch.get_rng_state()
    pm = nesgpu.PerturbedModel(net, 8, antithetic=True)
    pm.set_noise()
    out = pm(torch.ones(16, 5))
    pm.update(out.sum(1).view(2, 8))
    assert torch.equal(torch.get_rng_state(), before)


def test_convert_does_not_touch_global_rng():
    net = nn.Sequential(nn.Linear(50, 50), nn.Conv2d(3, 4, 3))
    before = torch.get_rng_state()
    nesgpu.convert(net, "lowrank")
    assert torch.equal(torch.get_rng_state(), before)


def test_derive_seed_mixes_every_key():
    seeds = {derive_seed(s, t, layer, blk) for s in range(3) for t in range(3) for layer in range(3) for blk in (-1, 0, 1)}
    assert len(seeds) == 81
    assert all(0 <= s < 2**63 for s in seeds)


def test_per_direction_draws_whole_blocks():
    src = NoiseSource(seed=0, layer=0, device=torch.device("cpu"))
    draw = lambda gen, n: {"z": torch.randn(n, 3, generator=gen)}
    whole = src.per_direction(2, 0, 3 * BLOCK, draw)["z"]
    part = src.per_direction(2, BLOCK - 2, BLOCK + 5, draw)["z"]
    torch.testing.assert_close(part, whole[BLOCK - 2 : BLOCK + 5], rtol=0, atol=0)
    with pytest.raises(ValueError, match="start < stop"):
        src.per_direction(2, 4, 4, draw)


def test_random_subsets_stay_in_groups_and_are_distinct():
    gen = torch.Generator().manual_seed(0)
    idx = random_subsets(12, 3, 2, rows=50, generator=gen, device=torch.device("cpu"))
    assert idx.shape == (50, 6)
    groups = idx.view(50, 3, 2) // 4
    assert torch.equal(groups, torch.arange(3).view(1, 3, 1).expand(50, 3, 2))
    assert (idx.view(50, 3, 2)[..., 0] != idx.view(50, 3, 2)[..., 1]).all()
