"""A fitness that is not finite is one error from ``--sigma auto``'s probe, not a probe line ("even sigma 1e-4 is
past the local response") followed by the first step's NaN error (issue 55)."""

import pytest
import torch
from test_probe import Quadratic, population

from nesgpu.probe import FLOOR, GRID, probe_sigma
from nesgpu.train import TrainConfig, train


class NaNAt(Quadratic):
    """Quadratic, but NaN for every member from sigma ``at`` on (0: the plain model's too)."""

    def __init__(self, at: float):
        super().__init__()
        self.at = at

    def fitness(self, pm, step):
        fitness, info = super().fitness(pm, step)
        return (fitness * float("nan") if pm.sigma >= self.at else fitness), info


def test_a_fitness_that_is_nan_for_the_plain_model_is_the_probes_one_error(tmp_path):
    lines = []
    with pytest.raises(ValueError) as caught:
        train(TrainConfig(out=str(tmp_path / "r"), log="none", sigma="auto", population=8, steps=2),
              task=NaNAt(0.0), model=torch.nn.Linear(3, 2).double(), log=lines.append)
    assert str(caught.value).startswith("non-finite fitness nan at step 1, member (repeat 0, direction 0); --sigma "
                                        f"auto's probe found it at sigma {FLOOR:g}, where every member is the plain "
                                        f"model; check the task")
    assert not any("sigma auto:" in str(line) or "past the local" in str(line) for line in lines), lines


def test_a_fitness_that_is_nan_from_the_smallest_candidate_on_says_so():
    with pytest.raises(ValueError, match=f"--sigma auto's probe found it at sigma {GRID[0]:g}, its smallest candidate "
                                         f".*give a smaller --sigma"):
        probe_sigma(population(), NaNAt(GRID[0]))


def test_a_fitness_that_breaks_only_at_a_large_sigma_ends_the_climb_there():
    probe = probe_sigma(population(), NaNAt(GRID[4]))
    assert [t["sigma"] for t in probe.tried] == list(GRID[:4]) and probe.sigma < GRID[4]
