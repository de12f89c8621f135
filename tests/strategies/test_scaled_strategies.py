"""SNES, CEM and separable CMA-ES: a sigma per parameter adapted through the population's scales; CMA-ES: a full
covariance through the population's covariance factor. Three steps of each, through the trainer's own step
object (chunked and not), equal a plain reference written from the papers' formulas with explicit members in
float64; a run resumes bit for bit (the scales, paths and covariance are in the checkpoint); all-tied fitness
moves nothing; a kind that cannot carry a per-parameter sigma is refused."""

import dataclasses
import math

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.population import Population
from nesgpu.strategies import CEM, CMAES, SNES, XNES, SepCMAES
from nesgpu.train.steps.evolution import EvolutionStep

N, D, SIGMA = 5, 6, 0.3
TARGET = torch.linspace(-1, 2, N, dtype=torch.float64)


class Sphere:
    """Fitness: minus the squared distance of the member's parameter vector to TARGET."""

    metric, default_target, summed_info = "minus_distance", None, frozenset()

    def fitness(self, pm, step):
        rows = pm(torch.ones((2 if pm.antithetic else 1) * pm.local_directions, 1, dtype=torch.float64))
        return -(rows - TARGET).pow(2).sum(-1).view(-1, pm.local_directions), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return float(-(model.weight[:, 0] - TARGET).pow(2).sum())


def vector_model():
    torch.manual_seed(0)
    return nn.Linear(1, N, bias=False).double()


def steps(strategy, count, chunk=None):
    """``count`` steps of the trainer's step object; the parameter vector and scales after each."""
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    step = EvolutionStep(Sphere(), Population(pm, chunk=chunk, log=lambda *a: None), strategy, SIGMA)
    out = []
    for _ in range(count):
        step.run()
        out.append((pm.model.weight[:, 0].detach().clone(), pm.scales()["weight"][:, 0].clone()))
    return out


def unit_noise(step):
    """z_d (D, N) of ``step``: the population's stream, which scales do not change."""
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    pm.set_noise(step=step)
    return pm.dense_noise()["weight"][:, :, 0]


def reference(table, rescale, count):
    """The papers' update with explicit members: x = theta + sigma * S o (+-z_d), utilities by rank."""
    theta, scale, out = vector_model().weight[:, 0].detach().clone(), torch.ones(N, dtype=torch.float64), []
    for step in range(1, count + 1):
        z = unit_noise(step)
        signed = torch.cat([z, -z])  # members (+d for every d, then -d)
        f = -(theta + SIGMA * scale * signed - TARGET).pow(2).sum(-1)
        u = torch.empty(2 * D, dtype=torch.float64)
        u[f.argsort(descending=True)] = table(2 * D)
        theta = theta + SIGMA * scale * (u[:, None] * signed).sum(0)
        scale = rescale(scale, (u[:, None] * (signed ** 2 - 1)).sum(0))
        out.append((theta, scale))
    return out


def snes_table(n):
    raw = (math.log(n / 2 + 1) - torch.log(torch.arange(1, n + 1, dtype=torch.float64))).clamp(min=0)
    return raw / raw.sum() - 1 / n


@pytest.mark.parametrize("chunk", [None, 2])
def test_snes_is_the_papers_update(chunk):
    lr = (3 + math.log(N)) / (5 * math.sqrt(N))
    expected = reference(snes_table, lambda s, g: s * torch.exp(lr / 2 * g), 3)
    for (theta, scale), (want_theta, want_scale) in zip(steps(SNES(D, num_perturbed=N), 3, chunk), expected):
        torch.testing.assert_close(theta, want_theta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(scale, want_scale, rtol=1e-12, atol=1e-12)
    assert not torch.equal(expected[-1][1], torch.ones(N, dtype=torch.float64))  # the scales did move


@pytest.mark.parametrize("chunk", [None, 4])
def test_cem_moves_to_the_elites_mean_and_spread(chunk):
    elites, smoothing = 4, 0.5

    def table(n):
        return torch.cat([torch.full((elites,), 1 / elites), torch.zeros(n - elites)]).double()

    expected = reference(table, lambda s, g: s * ((1 - smoothing) + smoothing * (g + 1)).sqrt(), 3)
    cem = CEM(D, elite_ratio=elites / (2 * D), smoothing=smoothing)
    for (theta, scale), (want_theta, want_scale) in zip(steps(cem, 3, chunk), expected):
        torch.testing.assert_close(theta, want_theta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(scale, want_scale, rtol=1e-12, atol=1e-12)


class Tied(Sphere):
    def fitness(self, pm, step):
        return torch.zeros(2, pm.local_directions, dtype=torch.float64), {}


@pytest.mark.parametrize("strategy", [SNES(D, num_perturbed=N), CEM(D), SepCMAES(D, num_perturbed=N),
                                      CMAES(D, num_perturbed=N), XNES(D, num_perturbed=N)])
def test_all_tied_fitness_moves_neither_the_mean_nor_the_scales(strategy):
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    before = pm.model.weight.detach().clone()
    step = EvolutionStep(Tied(), Population(pm, log=lambda *a: None), strategy, SIGMA)
    assert step.run()["no_signal"] and step.state.sigma == SIGMA
    assert torch.equal(pm.model.weight, before)
    if strategy.adapts_covariance:
        assert torch.equal(pm.covariance_factor(), torch.eye(N, dtype=torch.float64))
    else:
        assert torch.equal(pm.scales()["weight"], torch.ones_like(before))


@pytest.mark.parametrize("strategy", ["snes", "cem", "sep_cma_es", "cma_es", "xnes", "pgpe", "snes lowrank"])
def test_a_run_resumes_bit_for_bit_with_its_scales(tmp_path, strategy):
    from nesgpu.train import TrainConfig, train

    strategy, _, layer = strategy.partition(" ")
    options = {"per_parameter": True} if strategy == "pgpe" else {}

    def run(out, steps, resume=False):
        cfg = TrainConfig(strategy=strategy, layer=layer or "gaussian", steps=steps, population=2 * D, sigma=SIGMA,
                          checkpoint_every=1, log="none", out=str(out), strategy_options=options)
        model = vector_model()
        train(cfg, model=model, task=Sphere(), resume=resume, log=lambda *a, **k: None)
        return model.weight.detach().clone()

    whole = run(tmp_path / "whole", 4)
    run(tmp_path / "split", 2)
    assert torch.equal(run(tmp_path / "split", 4, resume=True), whole)
    state = torch.load(tmp_path / "split" / "checkpoint" / "state.pt", weights_only=True)["strategy"]
    if strategy == "cma_es":
        assert state["covariance"].shape == (N, N) and state["paths"]["C"].shape == (N, N)
    elif strategy == "xnes":
        assert state["covariance"].shape == (N, N)
    else:
        assert state["scales"]["weight"].shape == (N, 1)
    import csv  # every step logs the mean scale it evaluated: 1 at the first, adapted after
    rows = list(csv.DictReader((tmp_path / "whole" / "metrics.csv").open()))
    scale = [float(r["sigma_scale"]) for r in rows if r["sigma_scale"]]
    assert len(scale) == 4 and scale[0] == 1.0 and scale[-1] != 1.0


def test_a_kind_without_a_per_parameter_sigma_is_refused_in_one_line():
    from nesgpu.train import TrainConfig

    with pytest.raises(ValueError, match="strategy 'snes' adapts a sigma per parameter, which layer 'permuted' "
                                         "cannot carry .* use --layer gaussian"):
        TrainConfig(strategy="snes", layer="permuted").resolved()
    TrainConfig(strategy="snes", layer="lowrank").resolved()  # low-rank matrices take S = row x column
    with pytest.raises(ValueError, match="strategy 'sep_cma_es' adapts a sigma per parameter, which layer 'lowrank'"):
        TrainConfig(strategy="sep_cma_es", layer="lowrank").resolved()
    with pytest.raises(ValueError, match="strategy 'cma_es' adapts a covariance, which layer 'sparse'"):
        TrainConfig(strategy="cma_es", layer="sparse").resolved()
    with pytest.raises(ValueError, match="strategy 'pgpe' adapts a sigma per parameter, which layer 'lowrank'"):
        TrainConfig.flat(strategy="pgpe", per_parameter=True).resolved()
    TrainConfig(strategy="pgpe").resolved()  # one sigma for all: any kind


@pytest.mark.parametrize("chunk", [None, 4])
def test_pgpe_per_parameter_is_the_papers_sigma_rule_per_entry(chunk):
    """S <- S (1 + clip(sigma_lr mean_d u_d (z_d^2 - 1) / sqrt 2, +-max_sigma_change)), u_d the direction's
    centred utility from centered ranks, with the members evaluated at theta + sigma S o (+-z_d)."""
    from nesgpu.strategies import PGPE, centered_ranks

    sigma_lr, cap = 0.8, 0.02
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    pgpe = PGPE(D, num_perturbed=N, sigma_lr=sigma_lr, max_sigma_change=cap, per_parameter=True)
    step = EvolutionStep(Sphere(), Population(pm, chunk=chunk, log=lambda *a: None), pgpe, SIGMA)
    scale, capped = torch.ones(N, dtype=torch.float64), False
    for g in range(1, 4):
        theta, z = pm.model.weight[:, 0].detach().clone(), unit_noise(g)
        f = -(theta + SIGMA * scale * torch.stack([z, -z]) - TARGET).pow(2).sum(-1)  # (2, D)
        shaped = centered_ranks(f)
        u = (shaped[0] + shaped[1]) / 2
        u = u - u.mean()
        change = sigma_lr * (u[:, None] * (z ** 2 - 1)).sum(0) / (D * math.sqrt(2))
        capped |= bool((change.abs() > cap).any())
        scale = scale * (1 + change.clamp(-cap, cap))
        assert step.run()["sigma"] == SIGMA  # the global sigma stays; the scales adapt
        torch.testing.assert_close(pm.scales()["weight"][:, 0], scale, rtol=1e-12, atol=1e-12)
    assert capped and not torch.equal(scale, torch.ones(N, dtype=torch.float64))


def test_cma_es_refuses_a_model_above_its_limit_naming_the_separable_strategies():
    from nesgpu.strategies.cma_es import MAX_PARAMETERS

    CMAES(D, num_perturbed=MAX_PARAMETERS)
    with pytest.raises(ValueError, match="up to 10,000 evolving parameters; this one has 10,001: use sep_cma_es or "
                                         "snes"):
        CMAES(D, num_perturbed=MAX_PARAMETERS + 1)


def test_xnes_is_the_papers_update_and_refuses_a_large_model():
    """Glasmachers et al.'s xNES with explicit members in float64: m += sigma B sum u z, sigma and B moved by the
    exponential of the natural gradient G = sum u (z z^T - I), split into its trace and the rest."""
    from nesgpu.strategies.xnes import MAX_PARAMETERS

    with pytest.raises(ValueError, match="up to 2,000 evolving parameters; this one has 2,001: use cma_es"):
        XNES(D, num_perturbed=MAX_PARAMETERS + 1)
    lam, eta = 2 * D, 3 * (3 + math.log(N)) / (5 * N * math.sqrt(N))
    theta, factor, sigma = vector_model().weight[:, 0].detach().clone(), torch.eye(N, dtype=torch.float64), SIGMA
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    step = EvolutionStep(Sphere(), Population(pm, chunk=4, log=lambda *a: None), XNES(D, num_perturbed=N), SIGMA)
    for g in range(1, 4):
        z = torch.cat([unit_noise(g), -unit_noise(g)])  # the members' unit noise, +d then -d
        f = -(theta + sigma * z @ factor.t() - TARGET).pow(2).sum(-1)
        u = torch.empty(lam, dtype=torch.float64)
        u[f.argsort(descending=True)] = snes_table(lam)
        theta = theta + sigma * factor @ (u @ z)
        grad = sum(u[i] * (torch.outer(z[i], z[i]) - torch.eye(N, dtype=torch.float64)) for i in range(lam))
        trace = float(torch.trace(grad)) / N
        sigma = sigma * math.exp(eta / 2 * trace)
        factor = factor @ torch.linalg.matrix_exp(eta / 2 * (grad - trace * torch.eye(N, dtype=torch.float64)))
        step.run()
        torch.testing.assert_close(pm.model.weight[:, 0].detach(), theta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(pm.covariance_factor(), factor, rtol=1e-10, atol=1e-12)
        assert math.isclose(step.state.sigma, sigma, rel_tol=1e-12)


def test_cma_es_is_hansens_active_update():
    """The tutorial's (n, lambda)-CMA-ES with negative weights over the better member of each antithetic pair,
    explicit members in float64: the mean, sigma and the factor A = C^(1/2) the population samples with
    (decomposed every step at n = 5)."""
    from nesgpu.strategies.cma_es import active_weights
    from nesgpu.strategies.sep_cma_es import CMARates, recombination_weights

    mu_eff = float(1 / recombination_weights(D).square().sum())
    r = CMARates.of(N, mu_eff, separable=False)
    w = active_weights(D, N, r)
    assert w[:D // 2].sum() == pytest.approx(1) and (w[D // 2:] < 0).all()
    theta, cov, sigma = vector_model().weight[:, 0].detach().clone(), torch.eye(N, dtype=torch.float64), SIGMA
    factor, p_s, p_c = torch.eye(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64), torch.zeros(N)
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    cma = CMAES(D, num_perturbed=N)
    assert cma.eigen_every == 1
    step = EvolutionStep(Sphere(), Population(pm, chunk=4, log=lambda *a: None), cma, SIGMA)
    for g in range(1, 4):
        z, f = winners(g, theta, sigma, lambda u: u @ factor.t())
        y = z @ factor.t()
        weights = torch.empty(D, dtype=torch.float64)
        weights[f.argsort(descending=True)] = w
        positive = weights.clamp(min=0)
        y_w, z_w = positive @ y, positive @ z
        theta = theta + sigma * y_w
        p_s = (1 - r.c_s) * p_s + math.sqrt(r.c_s * (2 - r.c_s) * mu_eff) * z_w
        h_s = float(p_s.norm() / math.sqrt(1 - (1 - r.c_s) ** (2 * g)) < (1.4 + 2 / (N + 1)) * r.chi_n)
        p_c = (1 - r.c_c) * p_c + h_s * math.sqrt(r.c_c * (2 - r.c_c) * mu_eff) * y_w
        rescaled = torch.where(weights < 0, weights * N / z.square().sum(1), weights)
        cov = (1 - r.c_1 - r.c_mu * float(w.sum()) + (1 - h_s) * r.c_1 * r.c_c * (2 - r.c_c)) * cov + \
            r.c_1 * torch.outer(p_c, p_c) + r.c_mu * (y.t() * rescaled) @ y
        sigma = sigma * math.exp(r.c_s / r.d_s * (float(p_s.norm()) / r.chi_n - 1))
        values, vectors = torch.linalg.eigh(cov)
        factor = vectors @ torch.diag(values.sqrt()) @ vectors.t()
        step.run()
        torch.testing.assert_close(pm.model.weight[:, 0].detach(), theta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(pm.covariance_factor(), factor, rtol=1e-10, atol=1e-12)
        assert math.isclose(step.state.sigma, sigma, rel_tol=1e-12)
    assert not torch.allclose(factor, torch.eye(N, dtype=torch.float64), atol=1e-3)  # it did adapt


def winners(g, theta, sigma, mix):
    """Pairwise selection: the better member of each antithetic pair at step ``g`` as its signed unit noise (D, N),
    and its fitness; ``mix`` maps unit noise to the noise as evaluated."""
    z = unit_noise(g)
    f_plus = -(theta + sigma * mix(z) - TARGET).pow(2).sum(-1)
    f_minus = -(theta - sigma * mix(z) - TARGET).pow(2).sum(-1)
    plus = f_plus >= f_minus
    return torch.where(plus[:, None], z, -z), torch.where(plus, f_plus, f_minus)


def test_sep_cma_es_is_ros_and_hansens_update_with_pairwise_selection():
    from nesgpu.strategies.sep_cma_es import CMARates, recombination_weights

    w = recombination_weights(D)  # D candidates: the better of each pair
    mu_eff = float(1 / w.square().sum())
    r = CMARates.of(N, mu_eff)
    theta, c, sigma = vector_model().weight[:, 0].detach().clone(), torch.ones(N, dtype=torch.float64), SIGMA
    p_s, p_c = torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    step = EvolutionStep(Sphere(), Population(pm, chunk=4, log=lambda *a: None), SepCMAES(D, num_perturbed=N), SIGMA)
    for g in range(1, 4):
        z, f = winners(g, theta, sigma, lambda u: c.sqrt() * u)
        y = c.sqrt() * z
        weights = torch.empty(D, dtype=torch.float64)
        weights[f.argsort(descending=True)] = w
        y_w, z_w = weights @ y, weights @ z
        theta = theta + sigma * y_w
        p_s = (1 - r.c_s) * p_s + math.sqrt(r.c_s * (2 - r.c_s) * mu_eff) * z_w
        h_s = float(p_s.norm() / math.sqrt(1 - (1 - r.c_s) ** (2 * g)) < (1.4 + 2 / (N + 1)) * r.chi_n)
        p_c = (1 - r.c_c) * p_c + h_s * math.sqrt(r.c_c * (2 - r.c_c) * mu_eff) * y_w
        c = (1 - r.c_1 - r.c_mu + (1 - h_s) * r.c_1 * r.c_c * (2 - r.c_c)) * c + r.c_1 * p_c ** 2 + \
            r.c_mu * (weights[:, None] * y ** 2).sum(0)
        sigma = sigma * math.exp(r.c_s / r.d_s * (float(p_s.norm()) / r.chi_n - 1))
        assert step.run()["sigma"] == step.state.sigma  # the step logs the sigma the next one uses
        torch.testing.assert_close(pm.model.weight[:, 0].detach(), theta, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(pm.scales()["weight"][:, 0], c.sqrt(), rtol=1e-12, atol=1e-12)
        assert math.isclose(step.state.sigma, sigma, rel_tol=1e-12)


def test_cma_strategies_sample_independent_members_unless_told():
    from nesgpu.train import TrainConfig

    for name in ("sep_cma_es", "cma_es"):
        assert TrainConfig(strategy=name, layer="gaussian").resolved().antithetic is False
        assert TrainConfig(strategy=name, layer="gaussian", antithetic=True).resolved().antithetic is True
    assert TrainConfig(strategy="snes", layer="gaussian").resolved().antithetic is True


class PureNoise(Sphere):
    """Fitness that says nothing of the members: a fresh random number each."""

    def fitness(self, pm, step):
        gen = torch.Generator().manual_seed(1000 * step + pm.noise_range.start)
        return torch.randn(2, pm.local_directions, generator=gen, dtype=torch.float64), {}


@pytest.mark.parametrize("strategy", [SepCMAES(16, num_perturbed=20), CMAES(16, num_perturbed=20)])
def test_a_fitness_of_pure_noise_does_not_collapse_the_step_size(strategy):
    """Random selection picks both members of many antithetic pairs, whose z cancel in the recombination: the
    path stayed short and sigma fell 1e5-fold in 300 steps; with pairwise selection it holds."""
    model = nn.Linear(1, 20, bias=False).double()
    pm = nesgpu.PerturbedModel(nesgpu.convert(model, "gaussian"), 16, sigma=1.0, seed=3, antithetic=True)
    step = EvolutionStep(PureNoise(), Population(pm, log=lambda *a: None), strategy, 1.0)
    sigmas = [step.run()["sigma"] for _ in range(300)]
    assert 1e-2 < sigmas[-1] < 1e2, sigmas[::50]  # a random walk of log sigma about 0 (8 seeds: 10^-0.5..10^0.8)


class Shrinking(SepCMAES):
    """Separable CMA-ES whose sigma shrinks 1e-4-fold a step: it reaches the floor within a few steps."""

    def adapt(self, state, scales, seconds, means, paths):
        scales, paths, state = super().adapt(state, scales, seconds, means, paths)
        return scales, paths, dataclasses.replace(state, sigma=state.sigma * 1e-4)


def test_a_converged_search_holds_sigma_at_the_floor_with_one_warning():
    from nesgpu.model import MIN_SIGMA

    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    step = EvolutionStep(Sphere(), Population(pm, log=lambda *a: None), Shrinking(D, num_perturbed=N), SIGMA)
    with pytest.warns(UserWarning, match="the search has converged as far as noise can resolve") as caught:
        rows = [step.run() for _ in range(6)]  # without the floor: "sigma must be a number in [1e-12, ..."
    assert rows[-1]["sigma"] == MIN_SIGMA == step.state.sigma and len(caught) == 1
