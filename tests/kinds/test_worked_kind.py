"""docs/architecture.md's worked noise kind (Rademacher signs), registered as its page says: every test of
test_registered_kinds.py, the machinery that tests each registered kind, runs over it, and a model converted
with it by name is exact against a dense per-member reference."""

import inspect

import pytest
import torch
import test_registered_kinds  # tests/kinds is on sys.path
from torch import nn

import nesgpu
from conftest import doc_section
from nesgpu.kinds import KINDS, make_kind

MACHINERY = [f for name, f in vars(test_registered_kinds).items() if name.startswith("test_") and callable(f)]


@pytest.fixture
def rademacher():
    code, registration = doc_section("A noise kind of your own")
    namespace = {"__name__": "worked_kind", "KINDS": KINDS}
    for block in code + registration:
        exec(compile(block, "architecture.md: a noise kind", "exec"), namespace)
    yield namespace["Rademacher"]
    del KINDS["rademacher"]


def test_the_page_registers_its_kind_by_name(rademacher):
    assert KINDS["rademacher"] is rademacher and str(make_kind("rademacher")) == "rademacher"
    assert "rademacher" not in test_registered_kinds.NAMES  # collected before: the test below runs it here
    assert len(MACHINERY) >= 6, [f.__name__ for f in MACHINERY]


@pytest.mark.parametrize("check", MACHINERY, ids=lambda f: f.__name__)
def test_every_registered_kind_test_runs_over_it(rademacher, check):
    args = {"name": "rademacher"}
    if "antithetic" in inspect.signature(check).parameters:
        for antithetic in (False, True):
            check(**args, antithetic=antithetic)
    else:
        check(**args)


def test_its_entries_are_signs_of_mean_zero_and_a_model_converted_with_it_is_exact(rademacher):
    z = test_registered_kinds.record(make_kind("rademacher"), test_registered_kinds.LINEAR_GEOMETRY).tensors["z"]
    assert set(z.unique().tolist()) == {-1.0, 1.0}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    report = nesgpu.check(model, torch.randn(2, 5, 4), kind="rademacher")
    assert report.exact and not report.fallback, str(report)
