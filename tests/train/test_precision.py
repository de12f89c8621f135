"""The trainer says when a reduced precision will run emulated on this hardware, and only then."""

import pytest
import torch

from nesgpu.distributed import Ranks
from nesgpu.population import Population
from nesgpu.precision import native_support, slow_precision_note
from nesgpu.train import TrainConfig
from nesgpu.train.setup.build import build

CPU = torch.device("cpu")


def with_capabilities(monkeypatch, architecture="x86_64", **flags):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"architecture": architecture, "avx2": True, **flags})


@pytest.mark.parametrize("dtype,flag", [(torch.bfloat16, "avx512_bf16"), (torch.bfloat16, "amx_bf16"),
                                        (torch.float16, "avx512_fp16"), (torch.float16, "amx_fp16")])
def test_native_support_follows_the_cpu_flags(monkeypatch, dtype, flag):
    with_capabilities(monkeypatch, **{flag: True})
    assert native_support(CPU, dtype) is True and slow_precision_note(CPU, dtype) is None
    with_capabilities(monkeypatch, **{flag: False})
    assert native_support(CPU, dtype) is False
    note = slow_precision_note(CPU, dtype)
    assert "emulated" in note and flag in note and ("bf16" if dtype == torch.bfloat16 else "fp16") in note


def test_other_architectures_are_not_judged_by_x86_flags(monkeypatch):
    with_capabilities(monkeypatch, architecture="aarch64", bf16=True)
    assert native_support(CPU, torch.bfloat16) is None and slow_precision_note(CPU, torch.bfloat16) is None


@pytest.mark.parametrize("capability,bf16,fp16", [((7, 0), False, True), ((7, 5), False, True),
                                                  ((8, 0), True, True), ((9, 0), True, True), ((6, 1), False, False)])
def test_cuda_support_follows_the_compute_capability(monkeypatch, capability, bf16, fp16):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda")
    assert native_support(cuda, torch.bfloat16) is bf16 and native_support(cuda, torch.float16) is fp16
    note = slow_precision_note(cuda, torch.bfloat16)
    assert (note is None) == bf16
    if note:
        assert "8.0" in note and "bf16" in note


def test_unknown_support_gives_no_note(monkeypatch):
    monkeypatch.delattr(torch.cpu, "get_capabilities")
    assert native_support(CPU, torch.bfloat16) is None and slow_precision_note(CPU, torch.bfloat16) is None
    assert native_support(torch.device("meta"), torch.bfloat16) is None


@pytest.mark.parametrize("native", [True, False])
def test_the_evaluator_logs_the_note_once(monkeypatch, native):
    with_capabilities(monkeypatch, avx512_bf16=native)
    cfg = TrainConfig.flat(task="digits", population=8, hidden=(4,), batch_size=4, precision="bf16").resolved()
    pm = build(cfg, CPU, log=lambda *a: None).pm
    lines = []
    Population(pm, Ranks(), None, "bf16", log=lines.append)
    assert len(lines) == (0 if native else 1)
    fp32 = []
    Population(pm, Ranks(), None, "fp32", log=fp32.append)
    assert fp32 == []
