"""Which member each row belongs to, where the model does not hand a layer its rows first: a module
registered twice, tokens flattened to 2-D, metadata reads, and a first dimension nesgpu cannot place."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nesgpu
from nesgpu.layers.guarded_value import NeedsFallback


class Flattening(nn.Module):
    """A block that runs its MLP on the rows' tokens flattened to (rows * T, features)."""

    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(4), nn.Linear(4, 6), nn.Linear(6, 4)

    def forward(self, x):
        rows, tokens, features = x.shape
        h = self.down(torch.tanh(self.up(self.norm(x.reshape(-1, features)))))
        return h.view(rows, tokens, features)


class CastsToItsChildsDtype(nn.Module):
    """PEFT's LoRA layers and Mamba's blocks read a child's weight.dtype (metadata) before calling it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        assert self.lin.weight.shape == (3, 4) and self.lin.weight.requires_grad
        return self.lin(x.to(device=self.lin.weight.device, dtype=self.lin.weight.dtype))


class Router(nn.Module):
    """An MoE router that casts its matrix (``.to(dtype)``, ``.type(dtype)``; a float32 router of a bf16
    model: ``.float()``) or multiplies by its transpose."""

    def __init__(self, form):
        super().__init__()
        self.num_experts, self.weight, self.form = 3, nn.Parameter(torch.randn(3, 4)), form

    def forward(self, x):
        x = x.reshape(-1, 4)
        if self.form == "cast":
            logits = F.linear(x, self.weight.to(x.dtype).type(torch.float64))
        else:
            logits = x @ self.weight.t()
        return logits.softmax(-1)


@pytest.mark.parametrize("name, make, example", [
    ("registered twice", lambda: (lambda lin: nn.Sequential(lin, nn.Tanh(), lin))(nn.Linear(4, 4)),
     lambda: torch.randn(3, 4)),
    ("flattened tokens", Flattening, lambda: torch.randn(3, 5, 4)),
    ("metadata reads", CastsToItsChildsDtype, lambda: torch.randn(3, 4)),
    ("router cast", lambda: nn.Sequential(nn.Linear(4, 4), Router("cast")), lambda: torch.randn(3, 5, 4)),
    ("router transposed", lambda: nn.Sequential(nn.Linear(4, 4), Router("t")), lambda: torch.randn(3, 5, 4)),
    ("hf-style flattened ids", lambda: nn.Sequential(nn.Flatten(0, 1), nn.Embedding(9, 4)),
     lambda: {"input": torch.randint(0, 9, (3, 5))}),
])
@pytest.mark.parametrize("kind", ["lowrank", "gaussian"])
def test_rows_reach_their_own_members(name, make, example, kind):
    torch.manual_seed(0)
    report = nesgpu.check(make(), example(), kind=kind)
    assert report.exact, str(report)


def test_a_router_computing_in_float32_in_a_float64_model_matches_at_float32_precision():
    class Float32Router(Router):
        def forward(self, x):
            return F.linear(x.reshape(-1, 4).float(), self.weight.float()).softmax(-1)

    report = nesgpu.check(nn.Sequential(nn.Linear(4, 4), Float32Router("cast")), torch.randn(3, 5, 4), tolerance=1e-6)
    assert report.exact and report.worst > 1e-12, str(report)  # rounded at float32, as the member's own model is


def test_a_module_registered_twice_is_one_perturbed_module_in_both_slots():
    lin = nn.Linear(4, 4)
    net = nesgpu.convert(nn.Sequential(lin, nn.Tanh(), lin), "lowrank")
    assert net[0] is net[2] and isinstance(net[0], nesgpu.PerturbedLinear)


class Regroups(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(9, 4), nn.Linear(8, 3)

    def forward(self, input_ids):
        h = self.embed(input_ids)  # (rows, T, 4) -> pairs of tokens as (rows * T / 4, 2, 8)
        return self.head(h.reshape(-1, 2, 8))


class Sums(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x) * self.lin.weight.sum()


def test_a_first_dimension_that_is_neither_the_rows_nor_their_tokens_names_the_parent_to_fall_back():
    net = nesgpu.convert(Regroups(), "lowrank")
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    pm.set_noise()
    message = (r"head \(PerturbedLinear\): its input \(40, 2, 8\) has 40 rows on the first dimension, neither the "
               r"population's 8 rows nor their 8 x 20 tokens flattened")
    with pytest.raises(NeedsFallback, match=message) as error, pm.perturbing():
        net(input_ids=torch.randint(0, 9, (8, 20)))
    assert error.value.module == ""


def test_a_use_of_a_read_parameter_beyond_its_metadata_names_the_parent_to_fall_back():
    net = nesgpu.convert(Sums(), "lowrank")
    pm = nesgpu.PerturbedModel(net, 2)
    pm.set_noise()
    with pytest.raises(RuntimeError, match=r"parameter 'lin.weight' of PerturbedLinear was read directly and used by "
                                           r"sum .*convert\(\.\.\., fallback=\[''\]\)"), pm.perturbing():
        net(torch.randn(2, 4))


@pytest.mark.parametrize("make, example, says", [
    (Sums, lambda: torch.randn(3, 4), r"model \(Sums\) computes with its child's parameter 'lin.weight' \(sum\)"),
    (Regroups, lambda: {"input_ids": torch.randint(0, 9, (3, 20))},
     r"model \(Regroups\) hands head \(PerturbedLinear\) its rows regrouped \(input \(120, 2, 8\)\)"),
])
def test_the_first_population_call_puts_the_parent_into_the_exact_fallback_with_a_warning(make, example, says):
    torch.manual_seed(0)
    model = nesgpu.convert(make(), "lowrank")
    pm = nesgpu.PerturbedModel(model, 4, antithetic=True)
    before = [id(p) for p in pm.parameters()]
    pm.set_noise()
    rows = example()
    rows = {k: pm.member_rows(v) for k, v in rows.items()} if isinstance(rows, dict) else pm.member_rows(rows)
    with pytest.warns(UserWarning, match=says + r"; it runs through the exact torch.func fallback from now on"):
        pm(**rows) if isinstance(rows, dict) else pm(rows)
    assert isinstance(model, nesgpu.layers.FunctionalPerturbed)
    assert sorted(id(p) for p in pm.parameters()) == sorted(before)  # an optimizer built before still trains
    torch.manual_seed(0)
    report = nesgpu.check(make(), example())
    assert report.exact and list(report.fallback) == [""], str(report)


def test_a_module_the_call_never_reaches_is_an_error_for_training_and_reported_by_check():
    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.spare = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return self.used(x)

    pm = nesgpu.PerturbedModel(nesgpu.convert(Unused(), "lowrank"), 2)
    pm.set_noise()
    with pytest.raises(RuntimeError, match=r"perturbed modules \['spare'\] were not used by this population call"):
        pm(torch.randn(2, 4))
    report = nesgpu.check(Unused(), torch.randn(3, 4))
    assert report.exact and report.unused == ("spare",)
    assert "1 perturbed modules these inputs never reach" in str(report)


def test_a_fallback_module_whose_input_no_row_holds_runs_every_member_on_it():
    class Positions(nn.Module):  # a learned positional table, called with the sequence's positions only
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(10, 4))

        def forward(self, positions):
            return self.table[positions]

    class WithPositions(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.positions, self.head = nn.Embedding(9, 4), Positions(), nn.Linear(4, 2)

        def forward(self, input_ids):
            return self.head(self.embed(input_ids) + self.positions(torch.arange(input_ids.shape[1])))

    torch.manual_seed(0)
    report = nesgpu.check(WithPositions(), {"input_ids": torch.randint(0, 9, (3, 6))})
    assert report.exact and list(report.fallback) == ["positions"], str(report)
