"""The table of module forms: a user's own module type, registered with register_form, is converted to its
batched version (not the exact fallback) and is exact; its adopt receives the conversion's options, and a form
may declare options of its own (docs/architecture.md's worked example, run here); bad registrations are
refused."""

import dataclasses

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.kinds import KINDS, Gaussian, Geometry, LowRank
from nesgpu.layers import ConversionOptions, Form, PerturbedModule, form_table, register_form
from nesgpu.layers.swap import swap_class

from conftest import doc_section


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
        pop = self.population_of(x.shape[0], x.dtype, x.device)
        w = self.member_values("weight", pop, x.dtype)  # (R, D, C)
        return (x.view(pop.repeats, pop.directions, -1, x.shape[-1]) * w.unsqueeze(2)).view(x.shape)


def adopt_scale(module, found, kind, options):
    swap_class(module, PerturbedScale, "Perturbed")
    module.init_perturbation(Gaussian(), options.directions, {}, "elementwise")
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


def test_adopt_receives_the_conversions_options_frozen():
    seen = []

    def adopt(module, found, kind, options):
        seen.append(options)
        return adopt_scale(module, found, kind, options)

    register_form(Form("scale_seen", lambda m: isinstance(m, Scale), adopt, None))
    try:
        nesgpu.convert(nn.Sequential(nn.Linear(4, 3), Scale(3)), "lowrank", directions=4, rank=2, freeze=["0.bias"])
    finally:
        del form_table.FORMS["scale_seen"]
    (options,) = seen
    assert isinstance(options, ConversionOptions) and options.kind == LowRank(rank=2)
    assert (options.directions, options.bits, options.act_bits, options.freeze) == (4, None, None, ("0.bias",))
    with pytest.raises(AttributeError):
        options.bits = 8


def test_the_torch_types_are_forms_of_the_same_list_asked_after_yours():
    names = [f.name for f in form_table.forms()]
    assert names.index("Linear") < names.index("conv1d") and names.index("LSTM") < names.index("rms_norm")
    form = Form("gaussian_linear", lambda m: type(m) is nn.Linear, adopt_linear_gaussian, "linear")
    register_form(form)
    try:
        net = nesgpu.convert(nn.Sequential(nn.Linear(4, 3)), "lowrank")
    finally:
        del form_table.FORMS[form.name]
    assert net[0].kind == Gaussian()  # yours, asked first: not the torch type's rebuild with lowrank


def adopt_linear_gaussian(module, found, kind, options):
    swap_class(module, nesgpu.PerturbedLinear, "Perturbed")
    module.init_perturbation(Gaussian(), options.directions, {"weight": Geometry(*module.weight.shape)}, "linear")
    return module


def run_section(title: str, namespace: dict) -> None:
    """A worked example of docs/architecture.md run in ``namespace``: its code, then its registration."""
    code, registration = doc_section(title)
    assert code, title
    for block in code + registration:
        exec(compile(block, f"architecture.md: {title}", "exec"), namespace)


@pytest.fixture
def worked_form():
    namespace = {"__name__": "worked_form", "KINDS": KINDS, "nesgpu": nesgpu, "nn": nn}
    try:
        run_section("A noise kind of your own", namespace)
        run_section("A module form with an option of its own", namespace)
        yield namespace
    finally:
        form_table.FORMS.pop("transposed_linear", None)
        KINDS.pop("rademacher", None)


def test_the_worked_form_converts_its_module_batched_and_exact_reading_its_option(worked_form):
    transposed, rademacher = worked_form["TransposedLinear"], worked_form["Rademacher"]
    net = worked_form["net"]  # converted on the page with transposed_kind="rademacher"
    assert type(net[0]).__name__ == "PerturbedTransposedLinear" and net[0].kind == rademacher()
    assert net[2].kind == LowRank()
    torch.manual_seed(0)
    model = nn.Sequential(transposed(4, 6), nn.Tanh(), nn.Linear(6, 3))
    x = torch.randn(2, 5, 4)
    for options in ({}, {"transposed_kind": "rademacher"}, {"transposed_kind": "gaussian", "rank": 2}):
        report = nesgpu.check(model, x, kind="lowrank", **options)
        assert report.exact and not report.fallback, (options, str(report))
    assert nesgpu.convert(transposed(4, 6), "lowrank").kind == LowRank()  # no option: convert's kind


def test_the_worked_forms_option_is_checked_and_what_it_cannot_do_refused_by_name(worked_form):
    transposed = worked_form["TransposedLinear"]
    with pytest.raises(ValueError, match="transposed_linear: option 'transposed_kind' must be one of .*got 'nope'"):
        nesgpu.convert(nn.Sequential(transposed(4, 6)), "lowrank", transposed_kind="nope")
    with pytest.raises(TypeError, match=r"kind 'lowrank' takes options \['rank'\]; got \['ranks'\]; the registered "
                                        r"module forms take options \['transposed_kind'\]"):
        nesgpu.convert(nn.Sequential(transposed(4, 6)), "lowrank", ranks=2)
    with pytest.raises(ValueError, match=r"bits=8: 0 \(TransposedLinear\) has no low-bit version"):
        nesgpu.convert(nn.Sequential(transposed(4, 6)), "lowrank", bits=8)


def test_an_option_no_kind_or_form_takes_is_an_error():
    with pytest.raises(TypeError, match=r"kind 'lowrank' takes options \['rank'\]; got \['transposed_kind'\]"):
        nesgpu.convert(nn.Sequential(nn.Linear(4, 3)), "lowrank", transposed_kind="gaussian")


def test_a_forms_options_are_checked_when_it_is_registered():
    bad = [(dict(options=dict), TypeError, "options must be a dataclass of its options"),
           (dict(options=_WithBits), ValueError, r"options \['bits'\] are arguments of convert itself"),
           (dict(options=_Required), ValueError, r"options \['gain'\] have no default"),
           (dict(takes=frozenset({"noise"})), ValueError, "takes must be a frozenset of some of")]
    for extra, error, message in bad:
        with pytest.raises(error, match=message):
            register_form(Form("bad", lambda m: False, adopt_scale, None, **extra))
    assert "bad" not in form_table.FORMS


@dataclasses.dataclass(frozen=True)
class _WithBits:
    bits: int = 8


@dataclasses.dataclass(frozen=True)
class _Required:
    gain: float
