"""Under autocast the population forward runs in the autocast dtype end to end (no silent promotion of
the perturbation to fp32), matches the fp32 forward to that dtype's precision, and casts the noise once
per set_noise."""

import pytest
import torch
from conftest import CONV_CASES, DEVICES, LINEAR_CASES, case_id, randomize_
from torch.utils._python_dispatch import TorchDispatchMode

import nesgpu

DTYPES = {torch.bfloat16: 3e-2, torch.float16: 5e-3}  # dtype -> tolerance relative to the output's scale


def population(cls, options, directions=6, device="cpu"):
    if issubclass(cls, torch.nn.Conv2d):
        layer, x = cls(4, 8, 3, padding=1, **options), torch.randn(2 * directions, 4, 6, 6)
    else:
        layer, x = cls(24, 16, **options), torch.randn(2 * directions, 24)
    pm = nesgpu.PerturbedModel(randomize_(layer).to(device), directions, sigma=0.5, antithetic=True, seed=2)
    pm.set_noise()
    return layer, pm, x.to(device)


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_autocast_forward_matches_fp32_in_the_autocast_dtype(case, dtype, device):
    layer, pm, x = population(*case, device=device)
    expected = pm(x)
    with torch.autocast(device, dtype=dtype):
        got = pm(x)
    assert got.dtype == dtype
    scale = expected.abs().max()
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=DTYPES[dtype] * scale)
    # the perturbation term itself, not just the base GEMM, comes out right
    with torch.autocast(device, dtype=dtype):
        plain = layer(x)
    torch.testing.assert_close((got.float() - plain.float()), expected - layer(x), rtol=0,
                               atol=DTYPES[dtype] * scale)


class _FloatOutputs(TorchDispatchMode):
    """Records the dtype of every floating tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.dtypes.add(t.dtype)
        return out


@pytest.mark.parametrize("case", LINEAR_CASES + CONV_CASES, ids=case_id)
def test_autocast_forward_computes_nothing_in_fp32(case):
    _, pm, x = population(*case)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pm(x)  # the noise cast happens on the first call
        with _FloatOutputs() as seen:
            pm(x)
    assert seen.dtypes == {torch.bfloat16}


@pytest.mark.parametrize("case", [LINEAR_CASES[-1], CONV_CASES[-1]], ids=case_id)
def test_noise_is_cast_once_per_set_noise_and_the_update_stays_fp32(case):
    layer, pm, x = population(*case)
    record = layer.noise_record("weight")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pm(x)
        first = record.to(torch.bfloat16)
        pm(x)
        assert record.to(torch.bfloat16) is first  # kept across forwards (an RL rollout's hundreds of calls)
    assert all(t.dtype == torch.bfloat16 for t in first.tensors.values() if t.is_floating_point())
    assert all(t.dtype == torch.float32 for t in record.tensors.values() if t.is_floating_point())
    coef = torch.randn(pm.directions)
    pm.update(coef)
    assert layer.weight.grad.dtype == torch.float32
    torch.testing.assert_close(layer.weight.grad, torch.tensordot(coef, pm.dense_noise()["weight"], 1)
                               / (pm.sigma * pm.directions), rtol=1e-5, atol=1e-5)
    pm.set_noise(step=1)
    assert layer.noise_record("weight") is not record  # a new draw is a new record (and drops the old cast)
    pm.free_memory()
    assert layer.noise_record("weight") is None
