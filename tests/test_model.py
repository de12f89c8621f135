"""PerturbedModel and convert: the wrapper's contract, the update formula, and bad input."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import CONV_CASES, DEVICES, LINEAR_CASES, antithetic_or_skip, case_id, needs_antithetic, randomize_
from torch import nn

import nesgpu
from nesgpu.layers.sequential import shared_entry


def small_cnn():
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 3))


def make(case, directions, device="cpu", **kw):
    cls, options = case
    layer = cls(3, 4, 3, **options) if issubclass(cls, nn.Conv2d) else cls(6, 5, **options)
    randomize_(layer.double()).to(device)
    kw["antithetic"] = antithetic_or_skip(case, kw.get("antithetic", needs_antithetic(*case)))
    return layer, nesgpu.PerturbedModel(layer, directions, **kw)


# ----- update ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_update_equals_formula(case, antithetic, device):
    directions, repeats, sigma = 6, 4, 0.25
    layer, pm = make(case, directions, device, sigma=sigma, antithetic=antithetic)
    pm.set_noise()
    z = pm.dense_noise()
    w = torch.randn(repeats, directions, dtype=torch.float64).to(device)
    signs = torch.tensor([1.0, 1.0, -1.0, -1.0] if antithetic else [1.0] * 4, dtype=torch.float64).to(device)
    w_d = (signs[:, None] * w).mean(0)
    pm.update(w)
    for name in z:
        expected = torch.einsum("d,d...->...", w_d, z[name]) / (directions * sigma)
        torch.testing.assert_close(getattr(layer, name).grad, expected, rtol=1e-12, atol=1e-12)
    # a (D,) update adds onto the existing .grad
    before = {name: getattr(layer, name).grad.clone() for name in z}
    v = torch.randn(directions, dtype=torch.float64).to(device)
    pm.update(v)
    for name in z:
        expected = before[name] + torch.einsum("d,d...->...", v, z[name]) / (directions * sigma)
        torch.testing.assert_close(getattr(layer, name).grad, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
def test_chunked_updates_add_up_to_the_full_update(case):
    directions = 70
    layer, pm = make(case, directions, sigma=0.1)
    w = torch.randn(2, directions, dtype=torch.float64)
    pm.set_noise(step=3)
    pm.update(w)
    full = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    for lo, hi in [(0, 33), (33, 64), (64, 70)]:
        pm.set_noise(step=3, directions=range(lo, hi))
        pm.update(w[:, lo:hi])
    for n, p in layer.named_parameters():
        torch.testing.assert_close(p.grad, full[n], rtol=1e-12, atol=1e-12)


def test_optimizer_step_descends_with_losses():
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(3, 6, generator=gen)
    net = nesgpu.convert(nn.Linear(6, 3, bias=False), "lowrank", rank=2)
    pm = nesgpu.PerturbedModel(net, 256, sigma=0.05, antithetic=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    eye = torch.eye(6)
    start = (net.weight - target).pow(2).sum().item()
    for _ in range(100):
        pm.set_noise()
        # every member sees the 6 basis inputs: layout (sign, sample, direction, in), i.e. 12 repeats
        x = eye.view(1, 6, 1, 6).expand(2, 6, 256, 6).reshape(-1, 6)
        out = pm(x).view(2, 6, 256, 3)
        losses = (out - target.t().view(1, 6, 1, 3)).pow(2).sum((1, 3))  # (2, 256): (R, D)
        opt.zero_grad()
        pm.update(losses)
        opt.step()
    assert (net.weight - target).pow(2).sum().item() < 0.05 * start


# ----- the wrapper -------------------------------------------------------------------------------------
def test_plain_model_stays_unperturbed_and_methods_run_perturbed():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)

        def act(self, x):
            return self.fc(x).argmax(-1)

    net = nesgpu.convert(Net(), "flipout")
    pm = nesgpu.PerturbedModel(net, 8, sigma=0.5)
    pm.set_noise()
    x = torch.randn(8, 4)
    plain = F.linear(x, net.fc.weight, net.fc.bias)
    torch.testing.assert_close(net(x), plain)
    assert not torch.allclose(pm(x), plain)
    z = pm.dense_noise()
    expected = torch.stack([F.linear(x[d], net.fc.weight + 0.5 * z["fc.weight"][d],
                                     net.fc.bias + 0.5 * z["fc.bias"][d]) for d in range(8)]).argmax(-1)
    with pm.perturbing():
        assert torch.equal(net.act(x), expected)  # any method runs perturbed inside the block
        torch.testing.assert_close(net.fc(x), pm(x))  # submodules too
    assert not pm(x).requires_grad  # the population runs without autograd


def test_free_memory_drops_noise_and_forward_then_needs_set_noise():
    net = nesgpu.convert(small_cnn(), "permuted")
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    pm.set_noise()
    pm(torch.randn(8, 2, 5, 5))
    pm.free_memory()
    assert pm.noise_range is None and pm.noise_bytes() == 0
    with pytest.raises(ValueError, match="set_noise"):
        pm(torch.randn(8, 2, 5, 5))
    with pytest.raises(ValueError, match="set_noise"):
        pm.update(torch.zeros(4))


def test_convert_keeps_weights_and_options():
    torch.manual_seed(0)
    plain = small_cnn()
    x = torch.randn(5, 2, 5, 5)
    expected = plain(x)
    net = nesgpu.convert(plain, "lowrank", directions=4, rank=2)
    assert isinstance(net[0], nesgpu.PerturbedConv2d) and isinstance(net[3], nesgpu.PerturbedLinear)
    assert net[0].kind == nesgpu.kinds.LowRank(rank=2) and net[3].kind == net[0].kind
    assert net[0].directions == 4 and net[0].padding == (1, 1)
    torch.testing.assert_close(net(x), expected, rtol=0, atol=0)
    assert "rank=2" in repr(net)
    single = nesgpu.convert(nn.Linear(3, 2), "sparse", k=1)
    assert isinstance(single, nesgpu.PerturbedLinear) and single.kind == nesgpu.kinds.Sparse(k=1)


@pytest.mark.parametrize("kind", ["gaussian", "sparse", "permuted", "flipout", "lowrank"])
def test_noise_memory_matches_design(kind):
    """Noise memory per layer (weights; biases add D * out): see DESIGN.md."""
    d, out, inp = 64, 24, 40
    layer = nesgpu.convert(nn.Linear(inp, out), kind, directions=d, **({"permutation": "in"} if kind == "permuted" else {}))
    pm = nesgpu.PerturbedModel(layer, d, antithetic=True)
    pm.set_noise()
    assert {k: v.numel() for k, v in layer.noise_record("bias").tensors.items()} == {"z": d * out}
    sizes = {k: v.numel() for k, v in layer.noise_record("weight").tensors.items()}
    expected = {
        "gaussian": {"z": d * out * inp},
        "sparse": {"columns": d * 8, "values": d * out * 8},
        "permuted": {"shared": out * inp, "in_index": d * inp},
        "flipout": {"shared": out * inp, "in_signs": d * inp, "out_signs": d * out},
        "lowrank": {"a": d * out, "b": d * inp},
    }[kind]
    assert sizes == expected


# ----- bad input ---------------------------------------------------------------------------------------
def test_rows_not_a_multiple_of_directions():
    _, pm = make(LINEAR_CASES[0], 4)
    pm.set_noise()
    with pytest.raises(ValueError, match=r"input has 6 rows; expected a positive multiple of directions=4"):
        pm(torch.randn(6, 6, dtype=torch.float64))
    conv, pmc = make(CONV_CASES[0], 4)
    pmc.set_noise()
    with pytest.raises(ValueError, match=r"expected a positive multiple of directions=4"):
        pmc(torch.randn(5, 3, 6, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"expected input of shape \(repeats \* directions, 3, 2 spatial dims\)"):
        pmc(torch.randn(4, 2, 6, 6, dtype=torch.float64))


def test_no_rows_and_a_call_before_set_noise_are_named():
    _, pm = make(LINEAR_CASES[0], 4)
    with pytest.raises(ValueError, match=r"no noise: call set_noise\(\) first \(before a population call"):
        pm(torch.randn(4, 6, dtype=torch.float64))
    pm.set_noise()
    with pytest.raises(ValueError, match=r"input has 0 rows; expected a positive multiple of directions=4"):
        pm(torch.randn(0, 6, dtype=torch.float64))


def test_odd_repeats_with_antithetic():
    _, pm = make(LINEAR_CASES[0], 4, antithetic=True)
    pm.set_noise()
    with pytest.raises(ValueError, match=r"even number of repeats; input has 12 rows = 3 repeats x 4"):
        pm(torch.randn(12, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"even number of repeats"):
        pm.update(torch.zeros(3, 4))


def test_forward_before_set_noise():
    _, pm = make(LINEAR_CASES[0], 4)
    with pytest.raises(ValueError, match="call set_noise"):
        pm(torch.randn(4, 6, dtype=torch.float64))


def test_weights_of_the_wrong_shape():
    _, pm = make(LINEAR_CASES[0], 4)
    pm.set_noise()
    with pytest.raises(ValueError, match=r"weights must have shape \(4,\) or \(R, 4\); got \(5,\)"):
        pm.update(torch.zeros(5))
    with pytest.raises(ValueError, match=r"got \(2, 3\)"):
        pm.update(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        pm.update([0.0] * 4)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="no perturbed parameters"):
        nesgpu.PerturbedModel(nn.Linear(2, 2), 4)
    with pytest.raises(ValueError, match=r"sigma must be a number in \[1e-12, 1e\+18\]; got 0"):
        nesgpu.PerturbedModel(nesgpu.PerturbedLinear(2, 2), 4, sigma=0)
    with pytest.raises(ValueError, match="directions must be an int in"):
        nesgpu.PerturbedModel(nesgpu.PerturbedLinear(2, 2), 0)
    with pytest.raises(ValueError, match="built for directions=3; expected 4"):
        nesgpu.PerturbedModel(nesgpu.PerturbedLinear(2, 2, directions=3), 4)
    with pytest.raises(ValueError, match="unknown noise kind 'lowrnk'"):
        nesgpu.convert(nn.Linear(2, 2), "lowrnk")
    with pytest.raises(ValueError, match="kind 'sparse' has no conv product"):
        nesgpu.PerturbedConv2d(2, 4, 3, kind="sparse")
    with pytest.warns(UserWarning, match=r"0 \(Conv2d\): kind 'sparse' has no conv product; it takes IID Gaussian"):
        nesgpu.convert(small_cnn(), "sparse")
    with pytest.raises(ValueError, match="permutation must be one of"):
        nesgpu.PermutedLinear(4, 4, permutation="rows")
    with pytest.raises(ValueError, match=r"in_sparsity as a fraction must be in \(0, 1\]; got 1.5"):
        nesgpu.PermutedLinear(4, 4, in_sparsity=1.5)
    with pytest.raises(ValueError, match=r"out_sparsity as a count must be in \[1, 4\]; got 9"):
        nesgpu.PermutedLinear(4, 4, out_sparsity=9)
    with pytest.raises(ValueError, match="rank must be a positive int; got 0"):
        nesgpu.LowRankLinear(4, 4, rank=0)
    with pytest.raises(ValueError, match="signs must be one of"):
        nesgpu.FlipoutLinear(4, 4, signs="none")
    with pytest.raises(TypeError, match="nn.Module"):
        nesgpu.PerturbedModel(lambda x: x, 4)
    pm = nesgpu.PerturbedModel(nesgpu.PerturbedLinear(2, 2), 4)
    with pytest.raises(ValueError, match=r"within \[0, 4\)"):
        pm.set_noise(directions=range(2, 6))


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
def test_noise_sq_norms_match_dense_noise(case):
    cls, options = case
    layer = cls(4, 6, 3, groups=2, **options) if issubclass(cls, nn.Conv2d) else cls(6, 5, **options)
    pm = nesgpu.PerturbedModel(layer.double(), 7, antithetic=needs_antithetic(*case))
    pm.set_noise()
    dense = sum(z.flatten(1).pow(2).sum(1) for z in pm.dense_noise().values())
    torch.testing.assert_close(pm.noise_sq_norms(), dense, rtol=1e-12, atol=1e-12)
    assert pm.num_perturbed == sum(p.numel() for p in layer.parameters())


@pytest.mark.parametrize("kind", ["gaussian", "sparse", "permuted", "flipout", "lowrank"])
@pytest.mark.parametrize("antithetic", [True, False])
def test_a_shared_input_gives_the_population_of_the_repeated_rows(kind, antithetic):
    if kind == "permuted" and not antithetic:
        pytest.skip("the permuted kind needs antithetic sampling")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    model = nesgpu.convert(model, kind, **({"rank": 2} if kind == "lowrank" else {}))
    pm = nesgpu.PerturbedModel(model, 40, sigma=0.1, antithetic=antithetic)
    pm.set_noise(step=1)
    x = torch.randn(5, 3, 4, dtype=torch.double)
    signs = 2 if antithetic else 1
    rows = x.unsqueeze(0).unsqueeze(2).expand(signs, 5, 40, 3, 4).reshape(-1, 3, 4)
    torch.testing.assert_close(pm.shared_input(x), pm(rows), rtol=1e-12, atol=1e-12)
    assert shared_entry(pm.model) is not None  # the fast path ran


def test_a_shared_input_through_another_model_runs_on_the_rows():
    torch.manual_seed(0)
    for model in (nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)),  # fast path, frozen first bias
                  nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 2)),  # a perturbed norm first: rows
                  nn.Linear(4, 2)):  # not a Sequential: rows
        if isinstance(model, nn.Sequential) and isinstance(model[0], nn.Linear):
            model[0].bias.requires_grad_(False)
        model = nesgpu.convert(model.double(), "lowrank")
        pm = nesgpu.PerturbedModel(model, 8, sigma=0.1, antithetic=True)
        pm.set_noise(step=1)
        x = torch.randn(3, 4, dtype=torch.double)
        rows = x.unsqueeze(0).unsqueeze(2).expand(2, 3, 8, 4).reshape(-1, 4)
        torch.testing.assert_close(pm.shared_input(x), pm(rows), rtol=1e-12, atol=1e-12)


def test_a_parameter_frozen_after_convert_is_an_error_at_the_next_draw():
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1)), "lowrank")
    pm = nesgpu.PerturbedModel(net, 4, antithetic=True)
    pm.set_noise()
    net[1].weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"\['1.weight'\] were frozen .* convert\(model, ..., freeze"):
        pm.set_noise()


@pytest.mark.parametrize("options, match", [
    (dict(sigma=float("inf")), r"sigma must be a number in \[1e-12, 1e\+18\]"),
    (dict(sigma=float("nan")), r"sigma must be a number in \[1e-12, 1e\+18\]"),
    (dict(sigma=1e300), r"sigma must be a number in \[1e-12, 1e\+18\]; got 1e\+300"),  # sigma^2: inf
    (dict(directions=10**18), "directions must be an int in \\[1, 16,777,216\\]; got 1000000000000000000"),
    (dict(sigma=1e-45), r"sigma must be a number in \[1e-12, 1e\+18\]; got 1e-45"),  # 1 / sigma: inf grads
    (dict(seed=1.7), r"seed must be an int in \[0, 2\*\*63\)"),
    (dict(seed=-1), "seed must be an int"),
    (dict(seed=2**64), "seed must be an int"),
    (dict(seed="abc"), "seed must be an int"),
])
def test_bad_sigma_and_seed_are_refused(options, match):
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 4)), "lowrank")
    with pytest.raises(ValueError, match=match):
        nesgpu.PerturbedModel(net, **{"directions": 4, **options})


def test_antithetic_steps_and_weights_of_the_wrong_kind_are_refused():
    net = nesgpu.convert(nn.Sequential(nn.Linear(3, 4)), "lowrank")
    with pytest.raises(TypeError, match="antithetic must be True or False; got 'no'"):
        nesgpu.PerturbedModel(net, 4, antithetic="no")
    pm = nesgpu.PerturbedModel(net, 4)
    for step in (1.5, True, -1, "2"):
        with pytest.raises(TypeError, match="step must be an int >= 0"):
            pm.set_noise(step=step)
    pm.set_noise(step=3)
    with pytest.raises(TypeError, match=r"weights must be a floating-point torch.Tensor .* got torch.complex64"):
        pm.update(torch.ones(4, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"sigma must be a number in \[1e-12, 1e\+18\]"):
        pm.update(torch.ones(4), sigma=1e-45)


def test_a_model_on_the_meta_device_is_refused_with_what_to_do():
    net = nesgpu.convert(nn.Linear(4, 2, device="meta"), "lowrank")
    with pytest.raises(ValueError, match="on the meta device .* model.to_empty"):
        nesgpu.PerturbedModel(net, 4, antithetic=True)


@pytest.mark.parametrize("bad, where", [(float("nan"), "weights[2]"), (float("inf"), "weights[2]"),
                                        (-float("inf"), "weights[2]")])
def test_non_finite_weights_are_refused_naming_the_first(bad, where):
    layer, pm = make(LINEAR_CASES[0], 4)
    pm.set_noise()
    w = torch.tensor([0.5, 1.0, bad, bad], dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"weights must be finite; got {bad} at {re.escape(where)}"):
        pm.update(w)
    with pytest.raises(ValueError, match=r"got nan at weights\[1, 3\]"):  # (R, D): its own index
        pm.update(torch.tensor([[0.0] * 4, [0.0, 0.0, 0.0, float("nan")]], dtype=torch.float64))
    assert all(p.grad is None for p in layer.parameters())  # refused before any .grad was written
    pm.update(w, check_finite=False)  # the trainer's path: it refused non-finite fitness already
    assert not layer.weight.grad.isfinite().all()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_and_bool_weights_are_refused_with_their_dtype(dtype):
    _, pm = make(LINEAR_CASES[0], 4)
    pm.set_noise()
    for shape in ((4,), (2, 4)):
        with pytest.raises(TypeError, match=rf"weights must be a floating-point torch.Tensor of shape \(4,\) or "
                                            rf"\(R, 4\); got {dtype}"):
            pm.update(torch.ones(shape, dtype=dtype))


def test_weights_on_the_meta_device_are_refused_naming_the_models_device():
    _, pm = make(LINEAR_CASES[0], 4)
    pm.set_noise()
    with pytest.raises(ValueError, match=r"weights must hold values on the model's device \(cpu\); got a tensor on "
                                         r"the meta device"):
        pm.update(torch.ones(4, device="meta"))


@pytest.mark.parametrize("kind", ["lowrank", "gaussian", "sparse"])
@pytest.mark.parametrize("antithetic", [False, True])
def test_a_module_registered_twice_is_updated_with_the_estimate_of_its_one_perturbation(kind, antithetic):
    torch.manual_seed(0)
    shared = nn.Linear(4, 4)
    plain = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), shared, nn.Tanh(), shared).double()
    net = nesgpu.convert(copy.deepcopy(plain), kind, directions=5)
    directions, sigma = 5, 0.1
    pm = nesgpu.PerturbedModel(net, directions, sigma=sigma, antithetic=antithetic)
    pm.set_noise()
    eps = pm.dense_noise()  # the layers' own noise: the shared module's once, under its first name
    assert sorted(eps) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    x = torch.randn(2, 3, dtype=torch.float64)
    signs = [1.0, -1.0] if antithetic else [1.0]
    references = []  # each member as its own copy, the shared weight perturbed once for both its uses
    for s in signs:
        for d in range(directions):
            member = copy.deepcopy(plain)  # the copy keeps one module in both slots
            with torch.no_grad():
                for name, p in member.named_parameters():
                    p.add_(s * sigma * eps[name][d])
            references.append(member(x))
    reference = torch.stack(references).view(len(signs), directions, *x.shape[:1], 4).transpose(1, 2)
    torch.testing.assert_close(pm.by_member(pm(pm.member_rows(x))), reference, rtol=1e-12, atol=1e-12)
    losses = reference.pow(2).sum(-1).mean(1)  # (signs, D)
    w = (torch.tensor(signs, dtype=torch.float64).view(-1, 1) * losses).mean(0)
    pm.update(losses)
    for name, p in net.named_parameters():
        expected = torch.einsum("d,d...->...", w, eps[name]) / (directions * sigma)
        torch.testing.assert_close(p.grad, expected, rtol=1e-12, atol=1e-12)
    assert net[2] is net[4] and net[2].weight.grad is not None
