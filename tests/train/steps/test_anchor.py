"""--anchor: after every step the weights move anchor * (w - w_start) back toward the starting ones; exact against
a run that pulls by hand, the same chunked, bit for bit across a resume (the starting weights in the checkpoint),
and refused where it cannot apply."""

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.population import Population
from nesgpu.strategies import OpenAIES
from nesgpu.train.steps.evolution import EvolutionStep

N, D, SIGMA = 6, 4, 0.3
TARGET = torch.linspace(-1, 2, N, dtype=torch.float64)


class Sphere:
    """Fitness: minus the squared distance of the member's parameter vector to TARGET."""

    metric, default_target, summed_info = "minus_distance", None, frozenset()

    def fitness(self, pm, step):
        rows = pm(torch.ones(2 * pm.local_directions, 1, dtype=pm.model.weight.dtype)).double()
        return -(rows - TARGET).pow(2).sum(-1).view(2, pm.local_directions), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return float(-(model.weight[:, 0].detach() - TARGET).pow(2).sum())


def vector_model():
    torch.manual_seed(0)
    return nn.Linear(1, N, bias=False).double()


def steps(anchor, count=4, chunk=None, by_hand=0.0):
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model(), "gaussian"), D, sigma=SIGMA, seed=3, antithetic=True)
    start = pm.model.weight.detach().clone()
    step = EvolutionStep(Sphere(), Population(pm, chunk=chunk, log=lambda *a: None), OpenAIES(D), SIGMA, lr=0.05,
                         anchor=anchor)
    for _ in range(count):
        step.run()
        with torch.no_grad():
            pm.model.weight.sub_(pm.model.weight - start, alpha=by_hand)
    return pm.model.weight.detach().clone(), start


def test_the_pull_is_anchor_times_the_way_back_after_each_step_chunked_or_not():
    anchored, start = steps(0.2)
    torch.testing.assert_close(anchored, steps(0.0, by_hand=0.2)[0], rtol=0, atol=0)
    torch.testing.assert_close(steps(0.2, chunk=1)[0], anchored, rtol=1e-12, atol=1e-12)
    free = steps(0.0)[0]
    assert 0 < float((anchored - start).norm()) < float((free - start).norm())


def run(tmp_path, name, count, anchor=0.2, resume=False):
    from nesgpu.train import TrainConfig, train

    model = vector_model()
    cfg = TrainConfig(strategy="openai_es", layer="gaussian", steps=count, population=2 * D, sigma=SIGMA, lr=0.05,
                      anchor=anchor, checkpoint_every=1, log="none", out=str(tmp_path / name))
    train(cfg, model=model, task=Sphere(), resume=resume, log=lambda *a, **k: None)
    return model.weight.detach().clone()


def test_a_resumed_run_pulls_toward_the_same_start_bit_for_bit(tmp_path):
    whole = run(tmp_path, "whole", 4)
    run(tmp_path, "split", 2)
    state = torch.load(tmp_path / "split" / "checkpoint" / "state.pt", weights_only=True)["strategy"]
    torch.testing.assert_close(state["start"]["weight"], vector_model().weight.detach(), rtol=0, atol=0)
    assert torch.equal(run(tmp_path, "split", 4, resume=True), whole)


def test_an_anchor_that_cannot_apply_is_refused_in_one_line(tmp_path):
    from nesgpu.train import TrainConfig

    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="anchor must be a number in \\[0, 1\\)"):
            TrainConfig(task="digits", anchor=bad).resolved()
    with pytest.raises((TypeError, ValueError), match="option 'anchor' must be float; got True"):
        TrainConfig(task="digits", anchor=True).resolved()
    run(tmp_path, "plain", 2, anchor=0.0)
    with pytest.raises(ValueError, match="this checkpoint does not hold .the run started without --anchor."):
        run(tmp_path, "plain", 3, anchor=0.2, resume=True)


def test_the_start_keeps_only_what_evolves_and_is_swapped_in_and_back_even_on_error():
    from nesgpu.train.steps.anchor import StartingWeights

    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).double()
    model[0].requires_grad_(False)  # a frozen base, as under LoRA: not kept
    start = StartingWeights(model, list(model.parameters()))
    assert set(start.start) == {"1.weight", "1.bias"}
    initial = model[1].weight.detach().clone()
    with torch.no_grad():
        model[1].weight.add_(1.0)
    moved = model[1].weight.detach().clone()
    with pytest.raises(RuntimeError, match="inside"):
        with start.loaded():
            assert torch.equal(model[1].weight, initial)
            raise RuntimeError("inside")
    assert torch.equal(model[1].weight, moved) and torch.equal(start.start["1.weight"], initial)
    # the first --anchor checkpoints kept every parameter in order: still read
    assert start.load({"anchor": [p.detach() * 0 for p in model.parameters()]})
    assert float(start.start["1.weight"].abs().sum()) == 0
    assert not start.load({})


def test_a_half_precision_run_pulls_its_masters_toward_the_start():
    pm = nesgpu.PerturbedModel(nesgpu.convert(vector_model().bfloat16(), "gaussian"), D, sigma=SIGMA, seed=3)
    start = pm.model.weight.detach().clone()
    step = EvolutionStep(Sphere(), Population(pm, log=lambda *a: None), OpenAIES(D), SIGMA, lr=0.05, anchor=0.5)
    assert step.start.start["weight"].dtype == torch.bfloat16  # kept in the model's own dtype
    step.run()
    master = step.population.parameters()[0]
    assert master.dtype == torch.float32 and not torch.equal(master, start.float())
    free = EvolutionStep(Sphere(), Population(nesgpu.PerturbedModel(nesgpu.convert(vector_model().bfloat16(),
                                                                                   "gaussian"), D, sigma=SIGMA, seed=3),
                                              log=lambda *a: None), OpenAIES(D), SIGMA, lr=0.05)
    free.run()
    # the anchored master moved half as far from the start as the free one
    torch.testing.assert_close(master - start.float(), 0.5 * (free.population.parameters()[0] - start.float()))


def test_a_swap_that_fails_part_way_puts_back_what_it_swapped():
    from nesgpu.train.steps.anchor import StartingWeights

    model = nn.Linear(3, 2).double()
    start = StartingWeights(model, list(model.parameters()))
    with torch.no_grad():
        model.weight.add_(1.0)
        model.bias.add_(1.0)
    moved = [p.detach().clone() for p in model.parameters()]
    initial = {k: v.clone() for k, v in start.start.items()}
    calls, swap = [], start._swap

    def failing(p, other):
        calls.append(p)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        swap(p, other)

    start._swap = failing
    with pytest.raises(RuntimeError, match="out of memory"):
        with start.loaded():
            pass
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), moved))
    assert all(torch.equal(start.start[k], v) for k, v in initial.items())
