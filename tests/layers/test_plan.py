"""A layer's call plan (nesgpu.layers.plan), which a decode step reuses for every token: the same values as the
general path bit for bit, and never stale: weights changed in place or replaced, new noise, a new sigma, another
input shape or layout, autocast, each sees what the general path would."""

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES, randomize_
from torch import nn

import nesgpu
from nesgpu.layers import PerturbedLinear

SIGMA = 0.3


def member_linear(layer, x, sigma, directions):
    """Row n through F.linear with theta + sigma * s_r * z_d, r, d = divmod(n, D), antithetic (x: rows first)."""
    z, rows = layer.dense_noise(), []
    repeats = x.shape[0] // directions
    for n in range(x.shape[0]):
        r, d = divmod(n, directions)
        s = -sigma if r >= repeats // 2 else sigma
        w = layer.weight + s * z["weight"][d]
        b = None if layer.bias is None else layer.bias + s * z["bias"][d]
        rows.append(F.linear(x[n : n + 1], w, b))
    return torch.cat(rows)


@pytest.mark.parametrize("rank", [1, 3])
@pytest.mark.parametrize("positions", [1, 5])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_a_planned_call_is_the_general_path_bit_for_bit(rank, positions, bias, device):
    layer = randomize_(PerturbedLinear(7, 6, bias=bias, kind="lowrank", rank=rank)).to(device)
    pm = nesgpu.PerturbedModel(layer, 4, sigma=SIGMA, antithetic=True, seed=1)
    pm.set_noise(step=3)
    x = torch.randn(8, positions, 7).to(device)
    with pm.perturbing():
        planned = [layer(x) for _ in range(3)]  # built at the first call, then reused
        assert [plan.run is not None for plan in layer.perturbation.plans.values()] == [True]
        with layer.own_call():
            general = layer.population_forward(x)
    for y in planned:
        assert torch.equal(y, general)


def test_a_layer_called_on_two_shapes_in_turn_keeps_a_plan_for_each():
    layer = randomize_(PerturbedLinear(7, 6, kind="lowrank"))
    pm = nesgpu.PerturbedModel(layer, 4, sigma=SIGMA, antithetic=True, seed=1)
    pm.set_noise(step=0)
    a, b = torch.randn(8, 1, 7), torch.randn(8, 3, 7)
    with pm.perturbing():
        ya, yb, ya2 = layer(a), layer(b), layer(a)
        assert len(layer.perturbation.plans) == 2
        with layer.own_call():
            assert torch.equal(ya, layer.population_forward(a)) and torch.equal(yb, layer.population_forward(b))
    assert torch.equal(ya, ya2) and not layer.perturbation.plans  # dropped when the population call ends


def test_weights_changed_inside_a_population_call_are_seen():
    layer = randomize_(PerturbedLinear(5, 3, kind="lowrank")).double()
    pm = nesgpu.PerturbedModel(layer, 2, sigma=SIGMA, antithetic=True)
    pm.set_noise(step=0)
    x = torch.randn(4, 1, 5, dtype=torch.float64)

    def in_place():  # (own_call: the read guard lets the module's own parameters through)
        layer.weight.add_(0.5)
        layer.bias.data.add_(1.0)  # no version change: the plan reads the weights at every call

    def data():
        layer.weight.data = torch.randn(3, 5, dtype=torch.float64)  # another tensor under the same Parameter

    def replaced():
        layer.bias = nn.Parameter(torch.randn(3, dtype=torch.float64))

    with pm.perturbing():
        layer(x)
        for change in (in_place, data, replaced):
            with layer.own_call():
                change()
            y = layer(x)
            with layer.own_call():
                want = member_linear(layer, x.squeeze(1), SIGMA, 2)
            torch.testing.assert_close(y.squeeze(1), want, rtol=1e-12, atol=1e-12, msg=change.__name__)


def test_new_noise_and_a_new_sigma_are_never_served_from_an_old_plan():
    layer = randomize_(PerturbedLinear(5, 3, kind="lowrank")).double()
    pm = nesgpu.PerturbedModel(layer, 2, sigma=0.1, antithetic=True)
    x = torch.randn(4, 5, dtype=torch.float64)
    for step, sigma in ((0, 0.1), (1, 0.1), (1, 0.4)):
        pm.sigma = sigma
        pm.set_noise(step=step)
        with pm.perturbing():
            y, again = layer(x), layer(x)
            with layer.own_call():
                layer.set_noise(pm.seed, step + 10)  # a redraw inside the call drops the plan
            assert not layer.perturbation.plans
            redrawn = layer(x)
        torch.testing.assert_close(redrawn, member_linear(layer, x, sigma, 2), rtol=1e-12, atol=1e-12)
        pm.set_noise(step=step)
        torch.testing.assert_close(y, member_linear(layer, x, sigma, 2), rtol=1e-12, atol=1e-12)
        assert torch.equal(y, again)


class Flattening(nn.Module):
    """A block that runs its linear layer on the rows' tokens flattened, (rows * T, C), as an MoE's experts do."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        return self.proj(x.reshape(-1, x.shape[-1])).view(x.shape)


def test_the_same_input_shape_under_another_layout_is_not_planned_alike():
    """(8, 6) is the rows first when the model's input has 8 rows, and 4 rows' 2 tokens each when it has 4: a
    plan built for the first must not serve the second."""
    net = nesgpu.convert(randomize_(Flattening()).double(), "lowrank")
    pm = nesgpu.PerturbedModel(net, 2, sigma=SIGMA, antithetic=True)
    pm.set_noise(step=0)
    rows, tokens = torch.randn(8, 1, 6, dtype=torch.float64), torch.randn(4, 2, 6, dtype=torch.float64)
    with pm.perturbing():
        net(rows)
        together = net(tokens)  # the layer sees (8, 6) again
    assert torch.equal(together, pm(tokens))
    z = net.proj.dense_noise()
    for row in range(4):  # every token of a row takes the row's member
        r, d = divmod(row, 2)
        s = SIGMA if r == 0 else -SIGMA
        w, b = net.proj.weight + s * z["weight"][d], net.proj.bias + s * z["bias"][d]
        torch.testing.assert_close(together[row], F.linear(tokens[row], w, b), rtol=1e-12, atol=1e-12)


def test_autocast_inside_a_call_takes_the_general_path():
    layer = randomize_(PerturbedLinear(8, 4, kind="lowrank"))
    pm = nesgpu.PerturbedModel(layer, 2, sigma=SIGMA, antithetic=True)
    pm.set_noise(step=0)
    x = torch.randn(4, 8)
    with pm.perturbing():
        layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = layer(x)
            with layer.own_call():
                general = layer.population_forward(x)
    assert mixed.dtype == torch.bfloat16 and torch.equal(mixed, general)


def test_a_subclass_with_its_own_population_forward_is_not_planned():
    class Doubled(PerturbedLinear):
        def population_forward(self, x):
            return 2 * super().population_forward(x)

    class Halving:  # a mixin ahead of the layer in the MRO
        def population_forward(self, x):
            return 0.5 * super().population_forward(x)

    class Halved(Halving, PerturbedLinear):
        pass

    assert PerturbedLinear.PLANNED and not Doubled.PLANNED and not nesgpu.layers.LowBitLinear.PLANNED
    assert not Halved.PLANNED and nesgpu.layers.LowRankLinear.PLANNED
    layer = Doubled(5, 3, kind="lowrank")
    pm = nesgpu.PerturbedModel(layer, 2, sigma=SIGMA, antithetic=True)
    pm.set_noise(step=0)
    x = torch.randn(4, 5)
    with pm.perturbing():
        y = layer(x)
        with layer.own_call():
            assert torch.equal(y, 2 * PerturbedLinear.population_forward(layer, x))


def test_a_call_inside_a_population_block_leaves_the_block_perturbing():
    """``pm(x)`` inside ``with pm.perturbing()`` is a population call of its own: after it, the block's calls of the
    model still evaluate the population (they ran the plain model before)."""
    layer = randomize_(PerturbedLinear(5, 3, kind="lowrank"))
    pm = nesgpu.PerturbedModel(layer, 2, sigma=SIGMA, antithetic=True)
    pm.set_noise(step=0)
    x = torch.randn(4, 5)
    with pm.perturbing():
        inner = pm(x)
        outer = pm.model(x)
        assert layer.is_perturbing
    assert torch.equal(inner, outer) and not layer.is_perturbing


@pytest.mark.parametrize("family", ["llama", "gemma"])  # (w) x / rms(x), Llama's product in the input's dtype; Gemma's
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # (1 + w) in float32
def test_an_rms_norms_planned_call_is_the_general_path_and_sees_new_weights(family, dtype):
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = (LlamaRMSNorm if family == "llama" else GemmaRMSNorm)(6)
    net = nesgpu.convert(nn.Sequential(randomize_(norm)), "lowrank").to(dtype)
    assert type(net[0]).PLANNED, type(net[0]).__mro__
    pm = nesgpu.PerturbedModel(net, 2, sigma=SIGMA, antithetic=True)
    pm.set_noise(step=1)
    x = torch.randn(8, 3, 6).to(dtype)
    with pm.perturbing():
        first, second = net(x), net(x)
        with net[0].own_call():
            general = net[0].population_forward(x)
            net[0].weight.add_(1.0)
            moved = net[0].population_forward(x)
        after = net(x)
    assert torch.equal(first, general) and torch.equal(second, general)
    assert torch.equal(after, moved) and not torch.equal(after, first)
