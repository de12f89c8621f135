"""A covariance over all perturbed entries (PerturbedModel.set_covariance): member (r, d) evaluates
theta + sigma * s_r * (A z_d) across every parameter at once, the update reads A z_d, and covariance_statistics
gives CMA-ES's sums; in float64, against dense per-member references."""

import pytest
import torch
from torch import nn
from torch.func import functional_call

import nesgpu

SIGMA, D = 0.3, 5


def flat(noise: dict) -> torch.Tensor:
    """The dense noise of every parameter as one (D, n) matrix, in the covariance's order."""
    return torch.cat([z.reshape(z.shape[0], -1) for z in noise.values()], dim=1)


def random_factor(pm, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = pm.num_perturbed
    return torch.eye(n, dtype=torch.float64) + 0.3 * torch.randn(n, n, generator=gen, dtype=torch.float64)


CASES = {  # (model, population input of R * D rows)
    "mlp": (lambda: nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double(),
            lambda n: torch.randn(n, 5, dtype=torch.float64)),
    "conv": (lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2).double(),
             lambda n: torch.randn(n, 4, 5, 5, dtype=torch.float64)),
    "embedding": (lambda: nn.Embedding(7, 3).double(), lambda n: torch.randint(0, 7, (n, 6))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("antithetic", [False, True])
def test_every_member_is_theta_plus_sigma_s_r_times_a_z(case, antithetic):
    make, inputs = CASES[case]
    torch.manual_seed(0)
    net = nesgpu.convert(make(), "gaussian")
    pm = nesgpu.PerturbedModel(net, D, sigma=SIGMA, antithetic=antithetic, seed=3)
    pm.set_noise(step=1)
    unit = pm.dense_noise()
    factor = random_factor(pm)
    pm.set_covariance(factor)  # redraws the current noise with A
    mixed = pm.dense_noise()
    torch.testing.assert_close(flat(mixed), flat(unit) @ factor.t(), rtol=1e-12, atol=1e-12)
    repeats = 4
    x = inputs(repeats * D)
    with torch.no_grad():
        got = pm(x)
        rows = []
        for row in range(repeats * D):
            r, d = divmod(row, D)
            s = -1.0 if antithetic and r >= repeats // 2 else 1.0
            params = {name: net.get_parameter(name) + SIGMA * s * z[d] for name, z in mixed.items()}
            rows.append(functional_call(net, params, (x[row:row + 1],)))
    torch.testing.assert_close(got, torch.cat(rows), rtol=1e-10, atol=1e-10)


def test_the_update_sums_the_correlated_noise():
    """sum_d c_d y_d = A sum_d c_d z_d: the .grad with A is A times the .grad without, in the covariance's order."""
    grads = []
    for factor in (None, "random"):
        torch.manual_seed(0)
        pm = nesgpu.PerturbedModel(nesgpu.convert(CASES["mlp"][0](), "gaussian"), D, sigma=SIGMA, seed=3)
        if factor is not None:
            factor = random_factor(pm)
            pm.set_covariance(factor)
        pm.set_noise(step=1)
        pm.update(torch.linspace(-1, 2, D, dtype=torch.float64))
        grads.append(torch.cat([p.grad.reshape(-1) for p in pm.parameters()]))
    torch.testing.assert_close(grads[1], factor @ grads[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("antithetic", [False, True])
def test_statistics_are_cma_es_sums_and_chunks_add_up(antithetic):
    torch.manual_seed(0)
    pm = nesgpu.PerturbedModel(nesgpu.convert(CASES["mlp"][0](), "gaussian"), D, sigma=SIGMA, antithetic=antithetic,
                               seed=3)
    pm.set_noise(step=2)
    z = flat(pm.dense_noise())
    factor = random_factor(pm, seed=1)
    pm.set_covariance(factor)
    y = z @ factor.t()
    repeats = 2 if antithetic else 1
    weights = torch.randn(repeats, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    signs = torch.tensor([1.0, -1.0] if antithetic else [1.0], dtype=torch.float64)
    n = z.shape[1]
    first = sum(signs[r] * weights[r, d].clamp(min=0) * z[d] for r in range(repeats) for d in range(D))
    second = sum((weights[r, d] * (n / z[d].square().sum() if weights[r, d] < 0 else 1)) * torch.outer(y[d], y[d])
                 for r in range(repeats) for d in range(D))
    got_first, got_second = pm.covariance_statistics(weights)
    torch.testing.assert_close(got_first, first, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_second, second, rtol=1e-12, atol=1e-12)
    natural = pm.natural_statistics(weights)  # xNES's: all weights, in the unit noise
    torch.testing.assert_close(natural[0], sum(signs[r] * weights[r, d] * z[d] for r in range(repeats)
                                               for d in range(D)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(natural[1], sum(weights[r, d] * torch.outer(z[d], z[d]) for r in range(repeats)
                                               for d in range(D)), rtol=1e-12, atol=1e-12)
    parts = []
    for block in (range(0, 2), range(2, D)):
        pm.set_noise(step=2, directions=block)
        parts.append(pm.covariance_statistics(weights[:, block.start:block.stop]))
    torch.testing.assert_close(parts[0][0] + parts[1][0], first, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(parts[0][1] + parts[1][1], second, rtol=1e-12, atol=1e-12)


def test_the_factor_persists_across_steps_and_keeps_the_random_stream():
    torch.manual_seed(0)
    net = nesgpu.convert(CASES["mlp"][0](), "gaussian")
    plain = nesgpu.PerturbedModel(net, D, sigma=SIGMA, seed=3)
    plain.set_noise(step=7)
    unit = flat(plain.dense_noise())
    pm = nesgpu.PerturbedModel(net, D, sigma=SIGMA, seed=3)
    factor = random_factor(pm)
    pm.set_covariance(factor)
    pm.set_noise(step=7)
    torch.testing.assert_close(flat(pm.dense_noise()), unit @ factor.t(), rtol=1e-12, atol=1e-12)
    pm.set_covariance(None)  # the current noise drawn again, without A
    assert torch.equal(flat(pm.dense_noise()), unit) and pm.covariance_factor() is None


@pytest.mark.parametrize("factor, error, match", [
    (torch.eye(3), ValueError, r"shape \(39, 39\) for the model's 39 perturbed entries; got \(3, 3\)"),
    (torch.eye(39, dtype=torch.int64), TypeError, "floating-point torch.Tensor of shape .* got dtype torch.int64"),
    ([[1.0]], TypeError, "got list"),
    (torch.full((39, 39), float("nan")), ValueError, "finite everywhere"),
    (torch.eye(39, device="meta"), ValueError, r"on the meta device .* give a \(39, 39\) tensor with values"),
])
def test_bad_factors_are_refused_and_change_nothing(factor, error, match):
    pm = nesgpu.PerturbedModel(nesgpu.convert(CASES["mlp"][0](), "gaussian"), D, sigma=SIGMA)
    with pytest.raises(error, match=match):
        pm.set_covariance(factor)
    assert pm.covariance_factor() is None


def test_a_structured_kind_and_scales_beside_a_covariance_are_refused_by_name():
    lowrank = nesgpu.PerturbedModel(nesgpu.convert(CASES["mlp"][0](), "lowrank", rank=1), D, sigma=SIGMA)
    with pytest.raises(ValueError, match="'0.weight' has kind 'lowrank'.*--layer gaussian"):
        lowrank.set_covariance(torch.eye(lowrank.num_perturbed))
    padded = nesgpu.PerturbedModel(nesgpu.convert(nn.Embedding(7, 3, padding_idx=0), "gaussian"), D, sigma=SIGMA)
    with pytest.raises(ValueError, match="the model .PerturbedEmbedding. has entries that are never perturbed"):
        padded.set_covariance(torch.eye(21))
    pm = nesgpu.PerturbedModel(nesgpu.convert(CASES["mlp"][0](), "gaussian"), D, sigma=SIGMA)
    pm.set_scales(pm.unit_scales())
    with pytest.raises(ValueError, match="a covariance replaces it: set_scales\\(None\\) first"):
        pm.set_covariance(torch.eye(pm.num_perturbed))
    pm.set_scales(None)
    pm.set_covariance(torch.eye(pm.num_perturbed))
    with pytest.raises(ValueError, match="set_covariance\\(None\\) first"):
        pm.set_scales(pm.unit_scales())
    with pytest.raises(ValueError, match="need a covariance .* and noise drawn with it"):
        pm.covariance_statistics(torch.ones(D))
