"""Strategies: fitness shaping, the update each one makes, sigma / lr schedules, ClipUp, state."""

import math

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.strategies import ARS, PGPE, ClipUp, OpenAIES, Schedule, centered_ranks, top_directions, z_score


def make_pm(directions=8, antithetic=True, kind="gaussian", sigma=0.1):
    gen = torch.Generator().manual_seed(0)
    net = nesgpu.convert(nn.Linear(3, 2), kind)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return nesgpu.PerturbedModel(net.double(), directions, sigma=sigma, antithetic=antithetic, seed=1)


class Driver:
    """A hand-written loop over the ask/tell API: the population draws and updates, the strategy shapes."""

    def __init__(self, pm, strategy, optimizer=None, lr=None, lr_schedule=None):
        from nesgpu.population import Population
        from nesgpu.strategies import StepSizes

        self.pm, self.strategy = pm, strategy
        self.population = Population(pm, log=lambda *a: None)
        self.optimizer = optimizer or strategy.make_optimizer(self.population.parameters(), lr)
        self.lrs = StepSizes(self.optimizer, lr_schedule)
        self.state = strategy.init(pm.sigma)
        self.lrs.apply(0)

    def ask(self):
        """The step's sigma, and its noise drawn (as the population's evaluate does)."""
        self.sigma = self.strategy.ask(self.state)
        self.pm.sigma = self.sigma
        self.pm.set_noise(step=self.state.step + 1)

    def tell(self, fitness):
        from nesgpu.strategies import fitness_statistics

        fitness_statistics(fitness, self.state.step + 1, self.strategy.antithetic)  # the step's one read
        sq_norms = self.pm.noise_sq_norms() if self.strategy.needs_sq_norms else None
        weights, self.state = self.strategy.tell(self.state, fitness, sq_norms)
        self.population.step = self.state.step
        self.optimizer.zero_grad(set_to_none=True)
        self.population.update(weights, self.sigma)
        self.strategy.regularize(self.population.parameters())
        self.optimizer.step()
        self.lrs.apply(self.state.step)
        self.pm.sigma = self.state.sigma

    def state_dict(self):
        return {**self.state.as_dict(), "lr": self.lrs.bases, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        from nesgpu.strategies import StrategyState

        self.state = StrategyState.from_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.lrs.load(state["lr"], self.state.step)

    def set_lr(self, lr):
        self.lrs.set_base(lr, self.state.step)


def test_centered_ranks_and_z_score():
    f = torch.tensor([[3.0, -1.0, 10.0], [0.0, 2.0, 5.0]])
    r = centered_ranks(f)
    assert torch.allclose(r, torch.tensor([[0.1, -0.5, 0.5], [-0.3, -0.1, 0.3]]))
    assert torch.allclose(centered_ranks(f.exp()), r)  # invariant to monotone transforms
    z = z_score(f)
    assert abs(z.mean().item()) < 1e-6 and abs(z.std(unbiased=False).item() - 1) < 1e-6


def test_top_directions():
    plus, minus = torch.tensor([1.0, 5.0, 2.0, 0.0]), torch.tensor([4.0, 0.0, 1.0, 3.0])
    assert top_directions(plus, minus, 2).tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match=r"top_b must be in \[1, 4\]; got 5"):
        top_directions(plus, minus, 5)


def expected_grad(pm, w_d):
    z = pm.dense_noise()
    return {k: torch.einsum("d,d...->...", w_d, v) / (pm.directions * pm.sigma) for k, v in z.items()}


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_openai_es_update_is_minus_the_shaped_fitness_estimate_plus_l2(weight_decay):
    pm = make_pm()
    es = Driver(pm, OpenAIES(pm.directions, weight_decay=weight_decay),
                optimizer=torch.optim.SGD(pm.model.parameters(), lr=1.0))
    before = {k: v.clone() for k, v in pm.model.state_dict().items()}
    es.ask()
    f = torch.randn(2, 8, dtype=torch.float64)
    u = centered_ranks(f)
    g = expected_grad(pm, -(u[0] - u[1]) / 2)
    es.tell(f)
    for k in g:
        torch.testing.assert_close(pm.model.state_dict()[k], before[k] - g[k] - weight_decay * before[k])


def test_ars_is_the_papers_update():
    pm = make_pm(directions=8)
    ars = Driver(pm, ARS(pm.directions, top_b=3), lr=0.5)
    before = {k: v.clone() for k, v in pm.model.state_dict().items()}
    ars.ask()
    f = torch.randn(2, 8, dtype=torch.float64)
    z = pm.dense_noise()
    plus, minus = f[0], f[1]
    top = torch.maximum(plus, minus).topk(3).indices
    sigma_r = torch.cat([plus[top], minus[top]]).std(unbiased=False)
    ars.tell(f)
    for k in z:  # theta + alpha / (b sigma_R) sum_top (r+ - r-) delta
        step = 0.5 / (3 * sigma_r) * torch.einsum("d,d...->...", (plus - minus)[top], z[k][top])
        torch.testing.assert_close(pm.model.state_dict()[k], before[k] + step)


def test_ars_and_pgpe_need_antithetic():
    with pytest.raises(ValueError, match="antithetic"):
        ARS(make_pm(antithetic=False).directions, antithetic=False)
    with pytest.raises(ValueError, match="symmetric"):
        PGPE(make_pm(antithetic=False).directions, antithetic=False)


def test_pgpe_sigma_grows_when_larger_noise_does_better_and_is_capped():
    pm = make_pm(directions=64, sigma=0.1)
    pgpe = Driver(pm, PGPE(pm.directions, num_perturbed=pm.num_perturbed, sigma_lr=0.5, max_sigma_change=0.2))
    pgpe.ask()
    radius = pm.noise_sq_norms()  # larger noise -> better fitness, whichever sign
    pgpe.tell(torch.stack([radius, radius]))
    assert 0.1 < pm.sigma <= 0.1 * 1.2 + 1e-12
    pgpe.ask()
    radius = pm.noise_sq_norms()
    pgpe.tell(torch.stack([-radius, -radius]))
    assert pm.sigma < 0.12


def test_clipup_normalises_and_caps_speed():
    p = nn.Parameter(torch.zeros(4))
    opt = ClipUp([p], lr=0.1, max_speed=0.15, momentum=0.9)
    p.grad = torch.tensor([3.0, 4.0, 0.0, 0.0])  # norm 5 -> unit direction (0.6, 0.8)
    opt.step()
    torch.testing.assert_close(p.detach(), -0.1 * torch.tensor([0.6, 0.8, 0.0, 0.0]))
    for _ in range(20):
        opt.step()
    v = opt.state[p]["velocity"]
    assert abs(v.norm().item() - 0.15) < 1e-6  # velocity saturates at max_speed
    with pytest.raises(ValueError, match="lr must be > 0"):
        ClipUp([p], lr=0)


@pytest.mark.parametrize("kind,expected", [("constant", [1, 1, 1]), ("linear", [1, 0.55, 0.1]),
                                           ("cosine", [1, 0.55, 0.1]), ("exponential", [1, math.sqrt(0.1), 0.1])])
def test_schedules(kind, expected):
    s = Schedule(kind, final=0.1, steps=10)
    assert [s(0), s(5), s(10)] == pytest.approx(expected)
    assert s(20) == pytest.approx(expected[-1])
    with pytest.raises(ValueError, match="unknown schedule"):
        Schedule("step")


def test_rsqrt_holds_for_100_steps_then_decays_as_one_over_sqrt_step_whatever_the_runs_length():
    for steps in (10, 1_000_000):  # a time-budgeted run's --steps says nothing of its length
        s = Schedule("rsqrt", final=0.1, steps=steps)
        assert [s(0), s(1), s(100)] == [1.0, 1.0, 1.0]
        assert [s(400), s(10_000)] == pytest.approx([0.5, 0.1])


def test_sigma_and_lr_schedules_apply_per_step():
    pm = make_pm(sigma=0.2)
    es = Driver(pm, OpenAIES(pm.directions, sigma_schedule=Schedule("linear", 0.5, 4)), lr=0.1,
                lr_schedule=Schedule("linear", 0.0, 4))
    seen = []
    for _ in range(4):
        es.ask()
        seen.append(pm.sigma)
        es.tell(torch.randn(2, 8, dtype=torch.float64))
    assert seen == pytest.approx([0.2, 0.175, 0.15, 0.125])
    assert es.optimizer.param_groups[0]["lr"] == pytest.approx(0.0)


def test_tell_rejects_bad_fitness_naming_step_and_member():
    pm = make_pm()
    es = Driver(pm, OpenAIES(pm.directions))
    es.ask()
    f = torch.zeros(2, 8, dtype=torch.float64)
    f[1, 5] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite fitness nan at step 1, member \(repeat 1, direction 5\)"):
        es.tell(f)
    with pytest.raises(ValueError, match=r"fitness must have shape \(R, 8\)"):
        es.tell(torch.zeros(2, 7))
    with pytest.raises(ValueError, match="even number of repeats"):
        es.tell(torch.zeros(3, 8))


def test_state_dict_round_trip_continues_identically():
    def run(split):
        pm = make_pm()
        es = Driver(pm, OpenAIES(pm.directions), lr=0.05, lr_schedule=Schedule("cosine", 0.1, 6))
        fit = lambda: (pm(torch.ones(16, 3, dtype=torch.float64)).sum(-1).view(2, 8))  # noqa: E731
        for _ in range(split):
            es.ask()
            es.tell(fit())
        if split < 6:
            state = es.state_dict()
            pm2 = make_pm()
            es = Driver(pm2, OpenAIES(pm2.directions), lr=0.05, lr_schedule=Schedule("cosine", 0.1, 6))
            pm2.model.load_state_dict(pm.model.state_dict())
            es.load_state_dict(state)
            pm = pm2
            for _ in range(6 - split):
                es.ask()
                es.tell(fit())
        return pm.model.state_dict()

    full, resumed = run(6), run(3)
    for k in full:
        assert torch.equal(full[k], resumed[k])


@pytest.mark.parametrize("scheduled", [False, True])
def test_state_keeps_each_parameter_groups_step_size(scheduled):
    from nesgpu.strategies import OpenAIES, Schedule

    def make():
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        pm = nesgpu.PerturbedModel(nesgpu.convert(model, "gaussian"), 4, sigma=0.1, antithetic=True)
        opt = torch.optim.Adam([{"params": model[0].parameters(), "lr": 0.1},
                                {"params": model[1].parameters(), "lr": 0.01}])
        return Driver(pm, OpenAIES(pm.directions), optimizer=opt,
                      lr_schedule=Schedule("cosine", 0.1, 10) if scheduled else None)

    first = make()
    for _ in range(3):
        first.ask()
        first.tell(torch.randn(2, 4))
    second = make()
    second.load_state_dict(first.state_dict())
    lrs = [g["lr"] for g in first.optimizer.param_groups]
    assert [g["lr"] for g in second.optimizer.param_groups] == pytest.approx(lrs)
    assert lrs[1] == pytest.approx(lrs[0] / 10)
    second.set_lr(0.2)  # the first group's base; the others keep their ratio
    assert [g["lr"] for g in second.optimizer.param_groups] == pytest.approx([2 * lrs[0], 2 * lrs[1]])


@pytest.mark.parametrize("make", [lambda d: OpenAIES(d), lambda d: ARS(d, top_b=3),
                                  lambda d: PGPE(d, num_perturbed=8, sigma_lr=0.5)])
def test_tell_is_a_function_of_its_inputs_and_leaves_the_state_alone(make):
    from nesgpu.strategies import StrategyState

    strategy = make(8)
    state = strategy.init(0.1)
    fitness, sq_norms = torch.randn(2, 8, dtype=torch.float64), torch.rand(8, dtype=torch.float64) * 16
    w1, next1 = strategy.tell(state, fitness, sq_norms)
    w2, next2 = strategy.tell(state, fitness.clone(), sq_norms.clone())
    assert torch.equal(w1, w2) and next1 == next2
    assert state == StrategyState(step=0, sigma=0.1, sigma0=0.1) and next1.step == 1
    assert StrategyState.from_dict({**next1.as_dict(), "optimizer": {}}) == next1  # checkpointed as it is
    with pytest.raises(ValueError, match="strategy state has no 'sigma0'"):
        StrategyState.from_dict({"step": 1, "sigma": 0.1})


def test_only_pgpe_with_sigma_adaptation_reads_the_squared_norms():
    assert not OpenAIES(4).needs_sq_norms and not ARS(4).needs_sq_norms
    assert PGPE(4, num_perturbed=3).needs_sq_norms and not PGPE(4, sigma_lr=0).needs_sq_norms
    with pytest.raises(ValueError, match="needs num_perturbed"):
        PGPE(4)
    with pytest.raises(ValueError, match=r"needs sq_norms of shape \(4,\); got None"):
        pgpe = PGPE(4, num_perturbed=3)
        pgpe.tell(pgpe.init(0.1), torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"fitness must have shape \(R, 4\)"):
        ARS(4).tell(ARS(4).init(0.1), torch.randn(2, 5))


def test_a_sigma_schedule_is_asked_and_recorded():
    es = OpenAIES(4, sigma_schedule=Schedule("linear", 0.5, 4))
    state, seen = es.init(0.2), []
    for _ in range(4):
        seen.append(es.ask(state))
        _, state = es.tell(state, torch.randn(2, 4))
        assert state.sigma == seen[-1]  # the state records the sigma the step ran with
    assert seen == pytest.approx([0.2, 0.175, 0.15, 0.125]) and state.sigma0 == 0.2
