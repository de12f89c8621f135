"""A plain module whose own code fails on the population's rows (it assumes its batch) runs through the exact
fallback from the first population call, with a warning naming it; a module that keeps a state between calls
in its attributes is refused in the fallback, by name; an error of the model itself still reaches the user."""

import pytest
import torch
from torch import nn

import nesgpu


class MaxBatch(nn.Module):
    """Takes at most ``most`` rows at once (as a kernel with a batch limit): the population's rows break it,
    each member's own run does not."""

    def __init__(self, most):
        super().__init__()
        self.most, self.proj = most, nn.Linear(4, 4)

    def forward(self, x):
        if x.shape[0] > self.most:
            raise RuntimeError(f"at most {self.most} rows; got {x.shape[0]}")
        return self.proj(x).tanh()


class Net(nn.Module):
    def __init__(self, inner):
        super().__init__()
        torch.manual_seed(0)
        self.inner, self.head = inner, nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.inner(x))


class Stateful(nn.Module):
    """Keeps its last output as a state for the next call (as RecurrentGemma's blocks keep theirs)."""

    def __init__(self):
        super().__init__()
        self.proj, self.state = nn.Linear(4, 4), None

    def forward(self, x):
        y = self.proj(x) + (0 if self.state is None else self.state)
        self.state = y.detach()
        return y


def test_a_module_whose_code_fails_on_the_rows_takes_the_exact_fallback_by_name():
    report = nesgpu.check(Net(MaxBatch(3)), torch.randn(3, 4))
    assert report.exact, str(report)
    assert list(report.fallback) == ["inner"] and report.fallback["inner"].startswith("fails on the population's rows")
    pm = nesgpu.PerturbedModel(nesgpu.convert(Net(MaxBatch(2)), "lowrank"), 2, sigma=0.1)
    pm.set_noise()
    with pytest.warns(UserWarning, match=r"inner \(MaxBatch\) fails on the population's rows \(RuntimeError"):
        assert pm(torch.randn(4, 4)).shape == (4, 2)  # 2 repeats x 2 directions: rows above the limit


def test_the_fallback_is_not_set_up_in_the_middle_of_a_perturbing_block():
    """A module made inside the caller's block would run plain for the rest of it: refused, with the way out."""
    pm = nesgpu.PerturbedModel(nesgpu.convert(Net(MaxBatch(2)), "lowrank"), 2, sigma=0.1)
    pm.set_noise()
    x = torch.randn(4, 4)
    with pm.perturbing(unused=[]):
        with pytest.raises(ValueError, match=r"not in the middle of a `with pm.perturbing\(\):` block: call pm"):
            pm(x)
    with pytest.warns(UserWarning, match=r"inner \(MaxBatch\)"):
        want = pm(x)  # outside a block: put into the fallback
    with pm.perturbing():
        assert torch.equal(pm(x), want) and torch.equal(pm.model(x), want)


def test_a_state_kept_between_calls_is_refused_in_the_fallback():
    report = nesgpu.check(Net(Stateful()), torch.randn(2, 4), fallback=["inner"])
    assert report.refused is not None and "writes 'state', a state it keeps between calls" in report.refused
    pm = nesgpu.PerturbedModel(nesgpu.convert(Net(Stateful()), "lowrank", fallback=["inner"]), 2, sigma=0.1)
    pm.set_noise()
    with pytest.raises(RuntimeError, match="inner"):
        pm(torch.randn(2, 4))
    assert pm.model.inner.state is None  # set back: the module holds no member's state


def test_an_error_of_the_model_itself_reaches_the_user():
    class Picky(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 2)

        def forward(self, x):
            if x.shape[-1] != 5:
                raise ValueError("Picky wants 5 features")
            return self.proj(x[..., :4])

    pm = nesgpu.PerturbedModel(nesgpu.convert(Picky(), "lowrank"), 2, sigma=0.1)
    pm.set_noise()
    with pytest.raises((ValueError, RuntimeError), match="Picky wants 5 features"):
        with pytest.warns(UserWarning):
            pm(torch.randn(2, 4))
