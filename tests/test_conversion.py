"""convert(evolve=...): what evolves, and how a converted model tells it (summary, print)."""

import re

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.layers.functional import FunctionalPerturbed


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        return self.head(self.mlp(self.norm(self.embed(ids))))


def test_evolve_matrices_freezes_embeddings_norms_and_biases():
    net = nesgpu.convert(TinyLM(), "lowrank", evolve="matrices")
    evolving = sorted(n for n, p in net.named_parameters() if p.requires_grad)
    assert evolving == ["mlp.0.weight", "mlp.2.weight"]  # the tied head is the embedding table: frozen with it
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    pm.set_noise()
    assert sorted(pm.dense_noise()) == evolving
    assert pm.num_perturbed == 8 * 16 * 2
    text = repr(net)
    assert "frozen=['bias']" in text and "Embedding(11, 8)" in text  # a frozen embedding stays a plain module


def test_evolve_all_ties_the_head_to_the_table_and_the_summary_says_so():
    net = nesgpu.convert(TinyLM(), "lowrank")
    assert net.head.weight is net.embed.weight
    assert "tied={'weight': 'embed.weight'}" in repr(net.head)
    text = nesgpu.summary(net)
    total = sum(p.numel() for p in net.parameters())
    assert f"evolving {total:,} of {total:,} parameters (100.0%)" in text
    assert "tied (perturbed once, with the tensor they share): ['head.weight']" in text
    frozen = nesgpu.summary(nesgpu.convert(TinyLM(), "lowrank", evolve="matrices"))
    assert f"evolving {8 * 16 * 2:,} of" in frozen and "noise: lowrank 256" in frozen


def test_tied_weights_with_a_kind_the_table_lacks_take_its_gaussian_noise_once():
    with pytest.warns(UserWarning, match="no embedding product"):
        net = nesgpu.convert(TinyLM(), "flipout")
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    pm.set_noise()
    ids = torch.randint(0, 11, (8, 3))
    out = pm(ids)  # the head applies the table's Gaussian noise: the member's own model agrees
    z = pm.dense_noise()
    for row in (0, 5):
        d, sign = row % 4, 1.0 if row < 4 else -1.0
        params = {n: p + sign * pm.sigma * z[n][d] if n in z else p for n, p in net.named_parameters()}
        params["head.weight"] = params["embed.weight"]
        ref = torch.func.functional_call(net, params, (ids[row : row + 1],), tie_weights=False)
        torch.testing.assert_close(out[row], ref[0], rtol=1e-5, atol=1e-6)


def test_bad_evolve_and_nothing_left_to_evolve_are_errors():
    with pytest.raises(ValueError, match=r"evolve must be one of \['all', 'matrices'\]; got 'weights'"):
        nesgpu.convert(TinyLM(), "lowrank", evolve="weights")
    with pytest.raises(ValueError, match="evolve='matrices' leaves no trainable parameter"):
        nesgpu.convert(nn.Sequential(nn.LayerNorm(4)), "lowrank", evolve="matrices")


def test_a_tie_into_the_exact_fallback_is_refused_with_the_parameter_named():
    class Scaled(nn.Module):  # no batched version: the fallback, which cannot share another module's noise
        def __init__(self, weight):
            super().__init__()
            self.weight = weight

        def forward(self, x):
            return x @ self.weight

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.odd = Scaled(self.lin.weight)

        def forward(self, x):
            return self.odd(self.lin(x))

    with pytest.raises(ValueError, match=r"tied parameter 'odd.weight' is used by FunctionalScaled, which has no"
                                         r".*freeze it with convert\(..., freeze=\['lin.weight'\]\)"):
        nesgpu.convert(Net(), "lowrank")
    converted = nesgpu.convert(Net(), "lowrank", freeze=["lin.weight"])  # the advice works
    assert not converted.lin.weight.requires_grad


@pytest.mark.parametrize("make", [lambda: nn.Linear(3, 2, dtype=torch.complex64),
                                  lambda: nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2, dtype=torch.cfloat))])
def test_complex_parameters_are_refused_not_cut_to_their_real_part(make):
    model = make()
    name = next(n for n, p in model.named_parameters() if p.is_complex())
    with pytest.raises(TypeError, match=rf"parameter '{name}' is complex \(complex64\); expected real parameters"):
        nesgpu.convert(model, "lowrank")



def test_a_frozen_complex_parameter_may_stay():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2, dtype=torch.cfloat))
    frozen = nesgpu.convert(model, "gaussian", freeze=["1"])
    assert [n for n, p in frozen.named_parameters() if p.requires_grad] == ["0.weight", "0.bias"]


def test_a_tied_table_owns_its_noise_whichever_module_comes_first():
    class HeadFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 7, bias=False)
            self.embed = nn.Embedding(7, 4, padding_idx=0)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.embed(ids))

    net = nesgpu.convert(HeadFirst(), "lowrank")
    assert "tied={'weight': 'embed.weight'}" in repr(net.head)
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    pm.set_noise()
    drawn = net.embed.kind.dense(net.embed.noise_record("weight"))  # the noise as drawn, before any masking
    assert torch.equal(drawn[:, 0], torch.zeros(4, 4))  # the padding row: no noise, for the head too


class Zoo(nn.Module):
    """One of each family convert rebuilds: Linear, Conv2d, Embedding, LSTM, MultiheadAttention, norms."""

    def __init__(self):
        super().__init__()
        self.embed, self.conv = nn.Embedding(10, 6), nn.Conv2d(2, 3, 3)
        self.lstm, self.attn = nn.LSTM(6, 4, batch_first=True), nn.MultiheadAttention(6, 2, batch_first=True)
        self.norm, self.batch_norm, self.head = nn.LayerNorm(6), nn.BatchNorm1d(6), nn.Linear(6, 2)


def test_convert_keeps_the_models_parameter_objects():
    model = Zoo()
    before = dict(model.named_parameters())
    converted = nesgpu.convert(model, "lowrank")
    after = dict(converted.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)


def test_an_optimizer_built_before_convert_trains_the_converted_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # before convert
    net = nesgpu.convert(model, "lowrank")
    pm = nesgpu.PerturbedModel(net, 8, sigma=0.1, antithetic=True)
    pm.set_noise(step=1)
    x = torch.randn(5, 3)
    fitness = -pm.shared_input(x).view(2, 5, 8, 1).pow(2).mean((1, 3)).reshape(2, 8)
    start = [p.detach().clone() for p in net.parameters()]
    pm.update(-fitness)
    optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(start, net.parameters()))


def test_converting_a_converted_model_to_another_kind_is_an_error_and_to_the_same_is_a_no_op():
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1)), "lowrank")
    assert nesgpu.convert(net, "lowrank") is net
    with pytest.raises(ValueError, match=r"converted already with kind LowRank\(rank=1\).* to Gaussian\(\)"):
        nesgpu.convert(net, "gaussian")
    with pytest.raises(ValueError, match=r"to LowRank\(rank=2\)"):  # other options: another kind
        nesgpu.convert(net, "lowrank", rank=2)


def test_a_perturbed_layer_built_complex_is_refused_by_the_population():
    layer = nesgpu.layers.PerturbedLinear(3, 2, dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"parameter 'weight' is complex \(complex64\)"):
        nesgpu.PerturbedModel(layer, directions=4)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_a_layer_of_size_zero_is_refused():
    with pytest.raises(ValueError, match=r"parameter 'weight' has no elements \(shape \(0, 4\)\)"):
        nesgpu.convert(nn.Linear(4, 0), "lowrank")


@pytest.mark.parametrize("rank", [10**9, 33])
def test_a_rank_beyond_every_matrix_is_refused_at_convert_with_the_largest(rank):
    net = nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 2))  # 4 x 8 and 2 x 4: 32 entries at most
    with pytest.raises(ValueError, match=rf"rank={rank} is more than the entries of any matrix of the model \(the "
                                         rf"largest, 0.weight, has 32\).*expected rank <= 32, or layer 'gaussian'"):
        nesgpu.convert(net, "lowrank", rank=rank)
    with pytest.raises(ValueError, match=r"expected rank <= 576"):  # a kernel's columns: 2 * 3 * 3, 32 rows
        nesgpu.convert(nn.Conv2d(2, 32, 3), "lowrank", rank=577)
    with pytest.raises(ValueError, match=r"rank=16 is more than .* expected rank <= 15"):  # a layer built by hand
        nesgpu.PerturbedModel(nesgpu.LowRankLinear(3, 5, rank=16), 4)


def test_a_rank_some_matrices_can_use_fits_the_others_as_it_is():
    net = nesgpu.convert(nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1)), "lowrank", rank=8)
    pm = nesgpu.PerturbedModel(net, 4, sigma=0.1)
    pm.set_noise()
    assert pm.dense_noise()["2.weight"].shape == (4, 1, 4)  # a head of one output takes the model's rank
    assert nesgpu.convert(nn.Conv2d(2, 32, 3), "lowrank", rank=576).kind.rank == 576


@pytest.mark.parametrize("rank", [0, -1, 2.0, "2", True])
def test_a_rank_that_is_not_a_positive_int_is_refused(rank):
    with pytest.raises(ValueError, match=rf"rank must be a positive int; got {re.escape(repr(rank))}"):
        nesgpu.convert(nn.Linear(4, 4), "lowrank", rank=rank)


def test_a_module_registered_twice_takes_fallback_and_freeze_by_either_name():
    for name in ("0", "2"):
        layer = nn.Linear(4, 4)
        with pytest.warns(UserWarning, match="exact torch.func fallback"):
            net = nesgpu.convert(nn.Sequential(layer, nn.Tanh(), layer), "lowrank", fallback=[name])
        assert net[0] is net[2] and isinstance(net[0], FunctionalPerturbed)
        layer = nn.Linear(4, 4)
        net = nesgpu.convert(nn.Sequential(layer, nn.Tanh(), layer, nn.Linear(4, 2)), "lowrank",
                             freeze=[f"{name}.bias"])
        assert not net[0].bias.requires_grad and net[0] is net[2]
