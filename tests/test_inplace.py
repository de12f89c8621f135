"""The in-place update (seed replay): ``Population.apply`` writes ``-lr * g`` into the weights, equal to the ``.grad``
estimate stepped by plain SGD, for every kind; row slices change nothing; half-precision weights take it by
unbiased, reproducible stochastic rounding; no ``.grad`` and no master is made; chunking changes nothing."""

import math

import pytest
import torch
from torch import nn

from nesgpu import PerturbedModel, convert
from nesgpu.layers import estimate
from nesgpu.population import Population
from nesgpu.rounding import rounding_generator, stochastic_round_
from nesgpu.inplace import InPlaceAdam, InPlaceSGD
from nesgpu.kinds import KINDS  # every registered kind

SIGMA, LR = 0.1, 0.5


class SumTask:
    """Fitness of a fixed batch: each member's summed output (any function of the weights serves)."""

    summed_info = frozenset()

    def __init__(self, x, repeats=2):
        self.x, self.repeats = x, repeats

    def fitness(self, pm, step):
        d = pm.local_directions
        rows = self.x[: self.repeats * d]
        return pm(rows).sum(-1).view(self.repeats, d), {}

    def finish_step(self, pm, info):
        pass


def _net(kind, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Embedding(40, 12), nn.Linear(12, 6), nn.LayerNorm(6)).to(dtype)
    return convert(net, kind)


def _population(net, chunk=None, masters=True):
    pm = PerturbedModel(net, 4, sigma=SIGMA, antithetic=True, seed=3, masters=masters)
    return Population(pm, chunk=chunk, log=lambda *a: None)


@pytest.mark.parametrize("kind", KINDS)
def test_apply_is_the_grad_estimate_stepped_by_sgd_in_float64(kind):
    net = _net(kind)
    population = _population(net)
    task = SumTask(torch.randint(0, 40, (8,)))
    population.evaluate(task, 1, SIGMA)
    weights = torch.randn(2, 4, dtype=torch.float64)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    population.update(weights, SIGMA)
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    for p in net.parameters():
        p.grad = None
    population.apply(weights, SIGMA, InPlaceSGD(net.parameters(), lr=LR))
    for name, p in net.named_parameters():
        assert p.grad is None
        torch.testing.assert_close(p.detach(), before[name] - LR * grads[name], rtol=0, atol=1e-12, msg=name)


def test_apply_with_l2_decays_the_weights_as_sgd_with_weight_decay():
    net = _net("lowrank")
    population = _population(net)
    population.evaluate(SumTask(torch.randint(0, 40, (8,))), 1, SIGMA)
    weights = torch.randn(4, dtype=torch.float64)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    population.update(weights, SIGMA)
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    for p in net.parameters():
        p.grad = None
    population.apply(weights, SIGMA, InPlaceSGD(net.parameters(), lr=LR, l2=0.01))
    for name, p in net.named_parameters():
        expected = before[name] - LR * (grads[name] + 0.01 * before[name])
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-12, msg=name)


def test_row_slices_give_the_whole_update(monkeypatch):
    weights = torch.randn(2, 4, dtype=torch.float64)
    results = []
    for slice_entries in (estimate.SLICE, 25):  # the embedding (40, 12) in slices of 2 rows, the rest likewise
        monkeypatch.setattr(estimate, "SLICE", slice_entries)
        net = _net("lowrank")
        population = _population(net)
        population.evaluate(SumTask(torch.randint(0, 40, (8,), generator=torch.Generator().manual_seed(0))), 1, SIGMA)
        population.apply(weights, SIGMA, InPlaceSGD(net.parameters(), lr=LR))
        results.append({n: p.detach().clone() for n, p in net.named_parameters()})
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], rtol=0, atol=1e-13, msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_is_unbiased(dtype):
    # values strictly between two neighbours of dtype, at several fractions of the gap, both signs
    base = torch.tensor([1.0, -3.0, 0.0123, 1000.0, -7e-3], dtype=dtype)
    up = torch.nextafter(base, torch.full_like(base, math.inf))
    frac = torch.tensor([0.1, 0.5, 0.03, 0.9, 0.77])
    value = base.float() + frac * (up.float() - base.float())
    n = 200_000
    draws = stochastic_round_(value.repeat(n, 1), dtype, torch.Generator().manual_seed(0)).float()
    share_up = (draws == up.float()).double().mean(0)
    assert ((draws == up.float()) | (draws == base.float())).all()  # only the two neighbours
    # a binomial share: 5 standard deviations of n draws
    tolerance = 5 * torch.sqrt(frac.double() * (1 - frac.double()) / n)
    assert ((share_up - frac.double()).abs() <= tolerance).all(), (share_up, frac)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_keeps_exact_values_and_non_finite_ones(dtype):
    value = torch.tensor([1.0, -2.5, 0.0, math.inf, -math.inf, math.nan, math.nan, math.nan, math.nan])
    for i, bits in zip(range(6, 9), (0x7FFFFFFF, -1, 0x7F800001)):  # NaNs with their lower half set (CUDA's first)
        value.view(torch.int32)[i] = bits
    out = stochastic_round_(value.clone().repeat(100), dtype, torch.Generator().manual_seed(1)).view(100, -1)
    assert out.dtype == dtype
    assert torch.equal(out[:, :5].float(), value[:5].expand(100, 5)) and out[:, 5:].isnan().all()
    with pytest.raises(TypeError, match="float32"):
        stochastic_round_(value.double(), dtype, torch.Generator())


def test_stochastic_rounding_is_reproducible_from_its_seed():
    value = torch.randn(1000)
    a = stochastic_round_(value.clone(), torch.bfloat16, rounding_generator(torch.device("cpu"), 0, 5, 7, 1))
    b = stochastic_round_(value.clone(), torch.bfloat16, rounding_generator(torch.device("cpu"), 0, 5, 7, 1))
    c = stochastic_round_(value.clone(), torch.bfloat16, rounding_generator(torch.device("cpu"), 0, 6, 7, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)


def _bf16_steps(chunk, steps=3, rule=InPlaceSGD):
    net = _net("lowrank", torch.bfloat16, seed=4)
    population = _population(net, chunk=chunk, masters=False)
    optimizer = rule(net.parameters(), lr=1e-3)
    task = SumTask(torch.randint(0, 40, (8,), generator=torch.Generator().manual_seed(2)))
    weights = torch.randn(steps, 2, 4, generator=torch.Generator().manual_seed(5))
    for step in range(1, steps + 1):  # the weights fixed: a forward in blocks may round the fitness otherwise
        population.evaluate(task, step, SIGMA)
        population.apply(weights[step - 1], SIGMA, optimizer)
    return net, population


def test_a_half_precision_model_takes_the_update_in_place_with_no_grad_and_no_master():
    net, population = _bf16_steps(None)
    start = _net("lowrank", torch.bfloat16, seed=4)
    assert all(p.dtype == torch.bfloat16 and p.grad is None for p in net.parameters())
    assert all(p is q for p, q in zip(population.parameters(), net.parameters()))  # no float32 master
    assert population.pm.master_state() == {}
    moved = [name for (name, p), q in zip(net.named_parameters(), start.parameters()) if not torch.equal(p, q)]
    assert len(moved) == len(list(net.parameters()))  # far below bf16's resolution, yet every weight moved


@pytest.mark.parametrize("rule", [InPlaceSGD, InPlaceAdam])
def test_the_update_is_the_same_bit_for_bit_whatever_blocks_the_forward_ran_in(rule):
    whole, _ = _bf16_steps(None, rule=rule)
    chunked, _ = _bf16_steps(1, rule=rule)
    for (name, a), b in zip(whole.named_parameters(), chunked.parameters()):
        assert torch.equal(a, b), name


def test_apply_refuses_a_half_model_with_masters():
    population = _population(_net("lowrank", torch.bfloat16), masters=True)
    population.evaluate(SumTask(torch.randint(0, 40, (8,))), 1, SIGMA)
    with pytest.raises(ValueError, match="masters=False"):
        population.apply(torch.randn(4), SIGMA, InPlaceSGD([torch.nn.Parameter(torch.zeros(1))], lr=LR))


def test_in_place_sgd_holds_the_step_size_and_refuses_a_grad():
    p = nn.Parameter(torch.zeros(3))
    opt = InPlaceSGD([p], lr=0.1)
    opt.step()
    assert opt.state_dict()["state"] == {} and opt.param_groups[0]["lr"] == 0.1
    p.grad = torch.ones(3)
    with pytest.raises(RuntimeError, match="in place"):
        opt.step()
    for bad in (0, -1.0, math.nan, "0.1", True):
        with pytest.raises(ValueError, match="lr"):
            InPlaceSGD([p], lr=bad)


@pytest.mark.parametrize("cls", [InPlaceSGD, InPlaceAdam])
def test_a_resumed_in_place_optimizer_keeps_the_runs_l2_not_the_checkpoints(cls):
    saved = cls([nn.Parameter(torch.ones(3))], lr=0.1, l2=0.5).state_dict()
    resumed = cls([nn.Parameter(torch.ones(3))], lr=0.1, l2=0.01)
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["l2"] == 0.01


@pytest.mark.parametrize("kind", ["lowrank", "gaussian"])
def test_in_place_adam_is_torch_adam_over_the_grad_estimate_in_float64(kind):
    nets = [_net(kind), _net(kind)]
    populations = [_population(net) for net in nets]
    adam = torch.optim.Adam(nets[0].parameters(), lr=0.01, weight_decay=0.001)
    in_place = InPlaceAdam(nets[1].parameters(), lr=0.01, l2=0.001)
    task = SumTask(torch.randint(0, 40, (8,), generator=torch.Generator().manual_seed(1)))
    for step in range(1, 4):
        weights = torch.randn(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
        populations[0].evaluate(task, step, SIGMA)
        adam.zero_grad()
        populations[0].update(weights, SIGMA)
        adam.step()
        populations[1].evaluate(task, step, SIGMA)
        populations[1].apply(weights, SIGMA, in_place)
    for (name, a), b in zip(nets[0].named_parameters(), nets[1].parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-12, msg=name)
        assert b.grad is None
    assert in_place.param_groups[0]["step"] == 3


def test_in_place_adam_keeps_half_precision_moments_and_resumes_from_its_state():
    net, population = _bf16_steps(None, rule=InPlaceAdam)
    optimizer = InPlaceAdam(net.parameters(), lr=1e-3)
    population.evaluate(SumTask(torch.randint(0, 40, (8,))), 4, SIGMA)
    population.apply(torch.randn(4), SIGMA, optimizer)
    state = optimizer.state_dict()
    assert state["param_groups"][0]["step"] == 1
    assert all(v.dtype == torch.bfloat16 for st in state["state"].values() for v in st.values())
    again = InPlaceAdam(net.parameters(), lr=1e-3)
    again.load_state_dict(state)
    assert again.param_groups[0]["step"] == 1 and len(again.state) == len(optimizer.state)


@pytest.mark.parametrize("n", [300_001, 60_001])  # three from a 48-bit draw; one draw each below SMALL
def test_random_halves_are_uniform_16_bit_values(n):
    from nesgpu.rounding import random_halves

    values = random_halves(n, torch.Generator().manual_seed(3), torch.device("cpu"))
    assert values.shape == (n,) and values.dtype == torch.int32
    assert int(values.min()) >= 0 and int(values.max()) < 1 << 16
    # each of the 16 bits is set half the time, within 5 standard deviations of n draws
    shares = torch.stack([(values >> bit) & 1 for bit in range(16)]).double().mean(1)
    assert ((shares - 0.5).abs() < 5 * 0.5 / n ** 0.5).all(), shares


def test_anchor_with_half_precision_weights_updated_in_place_is_refused():
    from nesgpu.train import TrainConfig

    with pytest.raises(ValueError, match="--anchor pulls the weights"):
        TrainConfig(task="digits", update="sgd", dtype="bfloat16", anchor=0.01).resolved()
    TrainConfig(task="digits", update="sgd", anchor=0.01).resolved()  # float32 weights take the pull exactly
    TrainConfig(task="digits", update="strategy", dtype="bfloat16", anchor=0.01).resolved()  # masters do


def test_in_place_adam_keeps_a_float16_weight_s_moments_in_bfloat16():
    net = _net("lowrank", torch.float16, seed=4)
    population = _population(net, masters=False)
    optimizer = InPlaceAdam(net.parameters(), lr=1e-3)
    population.evaluate(SumTask(torch.randint(0, 40, (8,))), 1, 1e-4)  # g^2 ~ (0.29 / (2 * 1e-4))^2: past 65504
    population.apply(torch.randn(2, 4), 1e-4, optimizer)
    moments = [v for state in optimizer.state.values() for v in state.values()]
    assert moments and all(v.dtype == torch.bfloat16 and bool(v.float().isfinite().all()) for v in moments)
    assert all(p.dtype == torch.float16 and bool(p.isfinite().all()) for p in net.parameters())
    again = InPlaceAdam(net.parameters(), lr=1e-3)
    again.load_state_dict(optimizer.state_dict())  # torch would cast them to float16 (and to inf)
    for p in net.parameters():
        assert all(torch.equal(again.state[p][k], optimizer.state[p][k]) for k in ("exp_avg", "exp_avg_sq"))
