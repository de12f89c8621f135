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


def test_iid_noise_is_drawn_in_place_with_the_values_of_a_fresh_draw(monkeypatch):
    from nesgpu.kinds import Gaussian

    layer = nesgpu.convert(nn.Linear(7, 5), "gaussian")
    nesgpu.PerturbedModel(layer, 96, sigma=0.1)
    copies = []
    original = torch.Tensor.__setitem__

    def counting(self, key, value):
        copies.append(key)
        return original(self, key, value)

    monkeypatch.setattr(torch.Tensor, "__setitem__", counting)
    layer.set_noise(seed=3, step=2, start=0, stop=96)  # three whole blocks: no copies
    in_place = layer.dense_noise()
    assert not copies
    layer.set_noise(seed=3, step=2, start=5, stop=77)  # partial blocks at both ends are copied
    partial = layer.dense_noise()
    assert len(copies) == 2 * 2  # weight and bias of the first and the last block
    monkeypatch.setattr(Gaussian, "allocate_directions", lambda self, n, geometry, like: None)
    layer.set_noise(seed=3, step=2, start=0, stop=96)  # the draw-and-copy path
    fresh = layer.dense_noise()
    for key in fresh:
        assert torch.equal(in_place[key], fresh[key])
        assert torch.equal(partial[key], fresh[key][5:77])


def test_iid_noise_reuses_the_last_steps_tensors_unless_someone_holds_them():
    layer = nesgpu.convert(nn.Linear(7, 5), "gaussian")
    pm = nesgpu.PerturbedModel(layer, 64, sigma=0.1)
    pm.set_noise(step=1)
    storage = layer.noise_record("weight")["z"].data_ptr()
    pm.set_noise(step=2)
    assert layer.noise_record("weight")["z"].data_ptr() == storage  # refilled in place
    held = layer.dense_noise()["weight"]  # a caller's view of step 2's noise
    kept = held.clone()
    pm.set_noise(step=3)
    assert torch.equal(held, kept)  # not overwritten: step 3 got new memory
    fresh = nesgpu.PerturbedModel(nesgpu.convert(nn.Linear(7, 5), "gaussian"), 64, sigma=0.1)
    fresh.model.load_state_dict(layer.state_dict())
    fresh.set_noise(step=3)
    assert torch.equal(fresh.dense_noise()["weight"], layer.dense_noise()["weight"])


def test_a_held_noise_record_or_storage_is_never_refilled():
    layer = nesgpu.convert(nn.Linear(7, 5), "gaussian")
    pm = nesgpu.PerturbedModel(layer, 64, sigma=0.1)
    pm.set_noise(step=1)
    record = layer.noise_record("weight")  # a caller's record of step 1
    detached = record["z"].detach()  # and another tensor on the same storage
    kept = record["z"].clone()
    pm.set_noise(step=2)
    assert torch.equal(record["z"], kept) and torch.equal(detached, kept)
    del record
    pm.set_noise(step=3)
    assert torch.equal(detached, kept)  # the storage is still shared: step 3 got new memory too


def test_a_records_derived_values_follow_their_sources():
    """Noise.derived keeps fn() while its sources are the same tensors at the same version: an in-place change
    (or another tensor, a new sigma's) computes it again, never a stale value."""
    from nesgpu.kinds.base import Noise

    a, calls = torch.ones(3), []

    def double():
        calls.append(1)
        return a * 2

    record = Noise(None, (3,), {"a": a}, 1)
    assert record.derived("x", (a, None), double).eq(2).all()
    assert record.derived("x", (a, None), double).eq(2).all() and len(calls) == 1
    a.add_(1)  # in place: a new version
    assert record.derived("x", (a, None), double).eq(4).all() and len(calls) == 2
    other = a.clone()
    record.derived("x", (other, None), double)
    record.derived("x", (other, a), double)  # another number of sources
    assert len(calls) == 4


@pytest.mark.parametrize("positions", [1, 9])  # a decode step's one position per row; a sequence
def test_a_new_sigma_or_weights_on_the_same_noise_is_not_served_stale(positions):
    """The low-rank product keeps sigma times A_d per step: a second sigma, or weights updated in place, with the
    same noise give each member's own dense product in float64."""
    torch.manual_seed(0)
    layer = nesgpu.layers.PerturbedLinear(5, 4, kind="lowrank").double()
    pm = nesgpu.PerturbedModel(layer, 3, sigma=0.1, antithetic=True)
    pm.set_noise(step=2)
    z, x = layer.dense_noise(), torch.randn(2, 3, positions, 5, dtype=torch.float64)  # (signs, D, M, in)
    for sigma, step_weights in ((0.1, False), (0.3, False), (0.3, True)):
        pm.sigma = sigma
        if step_weights:
            with torch.no_grad():
                layer.weight.add_(1.0)
                layer.bias.data.add_(1.0)  # no new version: the bias is never kept
        with pm.perturbing():
            y = pm(x.reshape(6, positions, 5)).view(2, 3, positions, 4)
        for s, sign in enumerate((1, -1)):
            w = layer.weight + sign * sigma * z["weight"]  # (D, out, in)
            b = layer.bias + sign * sigma * z["bias"]
            want = torch.einsum("dmi,doi->dmo", x[s], w) + b.unsqueeze(1)
            torch.testing.assert_close(y[s], want, rtol=1e-12, atol=1e-12)
