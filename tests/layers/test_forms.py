"""The table of module forms: a user's own module type, registered with register_form, is converted to its
batched version (not the exact fallback) and is exact; bad registrations are refused."""

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.kinds import Gaussian
from nesgpu.layers import Form, PerturbedModule, form_table, register_form
from nesgpu.layers.swap import swap_class


class Scale(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(channels))

    def forward(self, x):
        return x * self.weight


class PerturbedScale(PerturbedModule):
    """Scale with a per-member weight: (R * D, ..., C) -> the same shape."""

    ROW_WISE = True

    def population_forward(self, x):
        pop = self._population(x.shape[0], x.dtype, x.device)
        w = self._member_values("weight", pop, x.dtype)  # (R, D, C)
        return (x.view(pop.repeats, pop.directions, -1, x.shape[-1]) * w.unsqueeze(2)).view(x.shape)


def adopt_scale(module, found, kind, directions):
    swap_class(module, PerturbedScale, "Perturbed")
    module._init_perturbation(Gaussian(), directions, {}, "elementwise")
    return module


@pytest.fixture
def scale_form():
    form = Form("scale", lambda m: isinstance(m, Scale), adopt_scale, None)
    register_form(form)
    yield form
    del form_table.FORMS[form.name]


def test_a_registered_form_converts_its_module_type_to_a_batched_exact_version(scale_form):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), Scale(3))
    report = nesgpu.check(model, torch.randn(2, 5, 4))
    assert report.exact and not report.fallback, str(report)
    assert type(nesgpu.convert(model, "lowrank")[1]).__name__ == "PerturbedScale"


def test_without_the_form_the_module_takes_the_exact_fallback():
    with pytest.warns(UserWarning, match=r"1 \(Scale\) has no batched perturbed version"):
        net = nesgpu.convert(nn.Sequential(nn.Linear(4, 3), Scale(3)), "lowrank")
    assert isinstance(net[1], nesgpu.layers.FunctionalPerturbed)


def test_bad_registrations_are_refused(scale_form):
    with pytest.raises(TypeError, match=r"a module form must be a nesgpu.layers.Form; got .* \(tuple\)"):
        register_form(("scale", None, None, None))
    with pytest.raises(ValueError, match="a module form named 'scale' is registered already"):
        register_form(scale_form)
