"""A checkpoint hands a strategy back its sigma, covariance factor, evolution paths and C: each is checked on load
(finite, of the right shape, C positive definite, the factor consistent with it, the paths no longer than their
updates make them), so that a damaged or tampered checkpoint is a ValueError naming the strategy and the entry
instead of a silently stalled run, absurd members, or a later error that blames the task. Also the strategies'
own refusals: a population of one for CMA-ES, a bool for num_perturbed, and a divergence under --scale-lr."""

import pytest
import torch
from test_scaled_strategies import D, N, SIGMA, Sphere
from torch import nn

import nesgpu
from nesgpu.population import Population
from nesgpu.strategies import CMAES, SNES, XNES, SepCMAES
from nesgpu.train.steps.evolution import EvolutionStep


def es_step(strategy):
    torch.manual_seed(0)
    pm = nesgpu.PerturbedModel(nesgpu.convert(nn.Linear(1, N, bias=False).double(), "gaussian"), D, sigma=SIGMA,
                               seed=3, antithetic=strategy.antithetic)
    return EvolutionStep(Sphere(), Population(pm, log=lambda *a: None), strategy, SIGMA)


STRATEGIES = {"cma_es": lambda: CMAES(D, antithetic=False, num_perturbed=N),
              "sep_cma_es": lambda: SepCMAES(D, antithetic=False, num_perturbed=N),
              "xnes": lambda: XNES(D, num_perturbed=N)}


def checkpoint(name, steps=3):
    step = es_step(STRATEGIES[name]())
    for _ in range(steps):
        step.run()
    state = step.state_dict()
    return {**state, "paths": dict(state.get("paths", {}))}


def times(entry, factor):
    def tamper(state):
        state["paths"][entry] = state["paths"][entry] * factor
    return tamper


def replace(where, entry, value):
    def tamper(state):
        (state["paths"] if where == "paths" else state)[entry] = value(state)
    return tamper


CASES = {  # strategy, how the checkpoint is changed, what the error says
    "cma_es factor zeroed": ("cma_es", replace("state", "covariance", lambda s: torch.zeros_like(s["covariance"])),
                             "covariance factor for strategy 'cma_es' is singular"),
    "cma_es C not positive definite": ("cma_es", replace("paths", "C", lambda s: -s["paths"]["C"]),
                                       "path 'C' .*'cma_es' is not positive definite"),
    "cma_es C of the wrong shape": ("cma_es", replace("paths", "C", lambda s: torch.eye(N + 1, dtype=torch.float64)),
                                    r"path 'C' for strategy 'cma_es' has shape \(6, 6\); expected .* \(5, 5\)"),
    "cma_es factor of the wrong shape": ("cma_es", replace("state", "covariance", lambda s: torch.eye(N + 1)),
                                         r"covariance factor for strategy 'cma_es' has shape \(6, 6\)"),
    "cma_es factor times 1e30": ("cma_es", replace("state", "covariance", lambda s: s["covariance"] * 1e30),
                                 "covariance factor for strategy 'cma_es' does not fit the covariance C"),
    "cma_es p_s times 1e30": ("cma_es", times("p_s", 1e30), "path 'p_s' for strategy 'cma_es' has length .*; "
                                                            "expected at most"),
    "cma_es p_c not finite": ("cma_es", times("p_c", float("nan")), "path 'p_c' .* is not finite everywhere"),
    "cma_es a path missing": ("cma_es", lambda s: s["paths"].pop("p_c"), "paths for strategy 'cma_es' are"),
    "cma_es sigma 1e300": ("cma_es", replace("state", "sigma", lambda s: 1e300),
                           r"sigma for strategy 'cma_es' is 1e\+300; expected a noise scale in \[1e-12, 1e\+18\]"),
    "cma_es step negative": ("cma_es", replace("state", "step", lambda s: -1), "step for strategy 'cma_es' is -1"),
    "xnes factor times 1e30": ("xnes", replace("state", "covariance", lambda s: s["covariance"] * 1e30),
                               r"covariance factor for strategy 'xnes' has det B\^\(1/n\) = 1e\+30; expected det B = 1"),
    "xnes factor on the meta device": ("xnes", replace("state", "covariance", lambda s: s["covariance"].to("meta")),
                                       "covariance factor for strategy 'xnes' holds no data"),
    "xnes factor of det 1 and condition 1e30": ("xnes", replace("state", "covariance", lambda s: torch.diag(
        torch.tensor([1e15, 1e-15] + [1.0] * (N - 2), dtype=s["covariance"].dtype))),
        r"covariance factor for strategy 'xnes' has singular values 1e\+30 times apart; expected at most 1e\+07"),
    "xnes paths": ("xnes", replace("paths", "p_s", lambda s: torch.zeros(N)), "paths for strategy 'xnes' are"),
    "sep_cma_es p_s times 1e30": ("sep_cma_es", times("p_s:weight", 1e30),
                                  "paths 'p_s:\\*' for strategy 'sep_cma_es' has length"),
    "sep_cma_es p_c of the wrong shape": ("sep_cma_es", replace("paths", "p_c:weight", lambda s: torch.zeros(N)),
                                          r"path 'p_c:weight' .* has shape \(5,\); expected .* \(5, 1\)"),
    "sep_cma_es sigma 0": ("sep_cma_es", replace("state", "sigma", lambda s: 0.0), "sigma for strategy 'sep_cma_es'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_checkpoint_is_refused_naming_the_strategy_and_the_entry(case):
    name, tamper, match = CASES[case]
    state = checkpoint(name)
    STRATEGIES[name]().load_state(state)  # as the run wrote it: loads
    tamper(state)
    step = es_step(STRATEGIES[name]())
    with pytest.raises(ValueError, match=match + ".*the checkpoint is damaged or was changed"):
        step.load_state_dict(state)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_checkpoint_a_run_wrote_loads_and_goes_on(name):
    state = checkpoint(name, steps=8)
    step = es_step(STRATEGIES[name]())
    step.load_state_dict(state)
    assert step.state.step == 8 and torch.isfinite(torch.tensor(step.run()["fitness_mean"]))


@pytest.mark.parametrize("make", [lambda: CMAES(1, antithetic=False, num_perturbed=N),
                                  lambda: CMAES(1, antithetic=True, num_perturbed=N),
                                  lambda: SepCMAES(1, antithetic=False, num_perturbed=N),
                                  lambda: XNES(1, antithetic=False, num_perturbed=N),
                                  lambda: SNES(1, antithetic=False, num_perturbed=N)])
def test_a_ranking_strategy_of_one_candidate_is_refused(make):  # else NaN weights, or zero ones on every step
    with pytest.raises(ValueError, match="needs at least 2 of them; got 1 .*raise the population"):
        make()


@pytest.mark.parametrize("cls", [CMAES, SepCMAES, XNES, SNES])
def test_num_perturbed_true_is_not_taken_for_one(cls):
    with pytest.raises(TypeError, match="num_perturbed is a count of parameters .* an int; got True"):
        cls(4, num_perturbed=True)


def test_a_divergence_under_a_given_scale_lr_names_it():
    step = es_step(SNES(D, antithetic=True, num_perturbed=N, scale_lr=1e9))
    with pytest.raises(ValueError, match=r"non-finite fitness .*check the task or lower sigma / lr, or lower "
                                         r"--scale-lr, now 1e\+09"):
        for _ in range(20):
            step.run()
    assert SNES(D, num_perturbed=N).divergence_hint == "check the task or lower sigma / lr"
