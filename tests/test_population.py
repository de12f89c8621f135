"""The population: the one owner of a step's directions (blocks, noise, processes, the update)."""

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.population import Population


class Rows:
    """A task whose fitness is each member's output on one shared input (no statistics)."""

    metric, default_target, summed_info = "none", None, frozenset({"count"})

    def fitness(self, pm, step):
        x = torch.ones(1, 3, dtype=torch.float64)
        out = pm(pm.member_rows(x)).sum(-1).view(2, pm.local_directions)
        return out, {"count": torch.tensor(pm.local_directions), "mean": out.mean()}

    def finish_step(self, pm, info):
        self.info = info

    def evaluate(self, model):
        return 0.0


def make(chunk, kind="lowrank"):
    torch.manual_seed(0)
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), kind).double()
    pm = nesgpu.PerturbedModel(net, 10, sigma=0.1, antithetic=True, seed=3)
    return Population(pm, chunk=chunk, log=lambda *a: None), net


@pytest.mark.parametrize("kind", ["lowrank", "gaussian"])
def test_blocks_give_the_whole_population_its_fitness_norms_statistics_and_update(kind):
    (whole, net_a), (chunked, net_b) = make(None, kind), make(3, kind)
    task_a, task_b = Rows(), Rows()
    a, b = whole.evaluate(task_a, 1, 0.1, sq_norms=True), chunked.evaluate(task_b, 1, 0.1, sq_norms=True)
    torch.testing.assert_close(a.fitness, b.fitness)
    torch.testing.assert_close(a.sq_norms, b.sq_norms)
    whole.pm.set_noise(step=1)
    torch.testing.assert_close(a.sq_norms, whole.pm.noise_sq_norms())  # ||z_d||^2 of every direction
    assert task_b.info["count"] == 10  # summed over the blocks
    torch.testing.assert_close(task_b.info["mean"], task_a.info["mean"])  # a mean over all directions
    weights = torch.randn(2, 10, dtype=torch.float64)
    for population, net in ((whole, net_a), (chunked, net_b)):
        population.update(weights, 0.1)  # the last evaluated step's noise, redrawn block by block
    for p, q in zip(net_a.parameters(), net_b.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_the_parameters_are_the_models_in_its_order():
    population, net = make(None)
    assert [id(p) for p in population.parameters()] == [id(p) for p in net.parameters()]


def test_what_is_not_a_perturbed_model_is_refused():
    with pytest.raises(TypeError, match="pm must be a PerturbedModel; got Linear"):
        Population(nn.Linear(2, 2))


def test_the_update_leaves_the_finiteness_check_to_the_trainer():
    population, net = make(3)
    population.evaluate(Rows(), 1, 0.1)
    calls = []
    update = population.pm.update
    population.pm.update = lambda *args, **kwargs: calls.append(kwargs) or update(*args, **kwargs)
    weights = torch.randn(2, 10, dtype=torch.float64)
    weights[1, 4] = float("nan")  # checked by the trainer before shaping: no host read per block here
    population.update(weights, 0.1)
    assert calls and all(kwargs.get("check_finite") is False for kwargs in calls)
    assert not net[0].weight.grad.isfinite().all()
