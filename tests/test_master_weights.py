"""A model held in bfloat16/float16 gets float32 master weights: an ES step below half-precision resolution
is kept, and the half model follows the fp32 run within its own rounding."""

import copy

import pytest
import torch
from torch import nn

import nesgpu


def run(model, steps=4, lr=3e-4):
    pm = nesgpu.PerturbedModel(model, 8, sigma=1e-3, antithetic=True, seed=2)
    opt = torch.optim.Adam(pm.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=gen)
    for _ in range(steps):
        pm.set_noise()
        out = pm(x.to(next(model.parameters()).dtype))
        assert out.dtype == next(model.parameters()).dtype  # the population runs in the model's dtype
        weights = torch.randn(2, 8, generator=gen)  # the same fitness for both runs: only precision differs
        opt.zero_grad()
        pm.update(weights)
        opt.step()
    return pm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_model_matches_the_fp32_run_within_its_rounding(dtype):
    torch.manual_seed(0)
    fp32 = nesgpu.convert(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), "lowrank")
    with torch.no_grad():  # both runs start from the same weights: those the half model can hold
        for p in fp32.parameters():
            p.copy_(p.to(dtype))
    half = copy.deepcopy(fp32).to(dtype)
    start = {n: p.detach().clone() for n, p in half.named_parameters()}
    run(fp32)
    pm = run(half)
    assert all(p.dtype == torch.float32 for p in pm.parameters())
    half(torch.zeros(1, 4, dtype=dtype))  # a plain call refreshes the model from its masters
    for (name, p), (_, ref) in zip(half.named_parameters(), fp32.named_parameters()):
        assert torch.equal(p, ref.detach().to(dtype)), name
    masters = dict(zip([n for n, _ in half.named_parameters()], pm.parameters()))
    moved = masters["0.weight"] - start["0.weight"].float()
    assert 0 < moved.abs().max() < 4 * 3e-4  # each step is far below bf16's resolution at these weights


def test_without_masters_a_tiny_step_would_round_away():
    w = torch.full((64,), 0.5, dtype=torch.bfloat16)
    assert torch.equal(w + 1e-4, w)  # why the masters exist


def test_a_bf16_language_model_runs_its_population_in_bf16_with_fp32_masters():
    tf = pytest.importorskip("transformers")
    config = tf.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                            num_attention_heads=2, pad_token_id=0)
    model = nesgpu.convert(tf.LlamaForCausalLM(config).to(torch.bfloat16), "lowrank", evolve="matrices")
    pm = nesgpu.PerturbedModel(model, 4, sigma=1e-3, antithetic=True)
    opt = torch.optim.SGD(pm.parameters(), lr=1e-4)
    before = model.lm_head.weight.detach().clone()
    for _ in range(3):
        pm.set_noise()
        logits = pm(input_ids=torch.randint(1, 40, (8, 5))).logits
        assert logits.dtype == torch.bfloat16
        opt.zero_grad()
        pm.update(logits.float().mean((1, 2)).view(2, 4))
        opt.step()
    masters = [p for p in pm.parameters() if p.shape == before.shape]
    assert len(masters) == 1 and masters[0].dtype == torch.float32
    assert (masters[0] - before.float()).abs().max() > 0  # kept in fp32, though below bf16's resolution


def half_mlp():
    torch.manual_seed(0)
    return nesgpu.convert(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), "lowrank").to(torch.bfloat16)


def test_an_optimizer_on_the_half_weights_is_told_it_trains_nothing():
    model = half_mlp()
    pm = nesgpu.PerturbedModel(model, 8, sigma=1e-2, antithetic=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # the half weights: their .grad stays None
    with pytest.warns(RuntimeWarning, match=r"not applied.*build the optimizer on PerturbedModel.parameters\(\)"):
        for _ in range(2):
            pm.set_noise()
            opt.zero_grad()
            pm.update(torch.randn(2, 8))
            opt.step()


def test_the_right_optimizer_and_chunked_updates_give_no_warning():
    import warnings

    model = half_mlp()
    pm = nesgpu.PerturbedModel(model, 8, sigma=1e-2, antithetic=True)
    opt = torch.optim.Adam(pm.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in pm.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning fails the test
        for step in range(1, 4):
            opt.zero_grad()
            for block in (range(0, 4), range(4, 8)):  # the blocks of one step add up before the step
                pm.set_noise(step=step, directions=block)
                pm.update(torch.randn(2, 4))
            opt.step()
            pm.set_noise(step=step + 1)
    assert all(p.dtype == torch.float32 and not torch.equal(p, b) for p, b in zip(pm.parameters(), before))


def test_export_right_after_a_step_has_the_steps_weights():
    model = half_mlp()
    pm = nesgpu.PerturbedModel(model, 8, sigma=1e-2, antithetic=True)
    opt = torch.optim.SGD(pm.parameters(), lr=10.0)  # a step large enough to show in bf16
    pm.set_noise()
    pm.update(torch.randn(2, 8))
    opt.step()  # no call of the model since: its own weights are the step before's
    plain = nesgpu.export(model)
    for p, master in zip(plain.parameters(), pm.parameters()):
        assert torch.equal(p, master.detach().to(torch.bfloat16))
