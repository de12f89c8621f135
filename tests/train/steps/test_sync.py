"""The hot loop does not wait on the device: one host read per step (the fitness statistics)."""

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import nesgpu
from nesgpu.train import TrainConfig
from nesgpu.train.setup.build import build

PACKAGE = str(Path(nesgpu.__file__).parent)
READS = ["item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"]


@pytest.fixture
def host_reads(monkeypatch):
    """Counts, by caller, the Tensor methods that copy a value to the host, when nesgpu's code calls them."""
    seen = Counter()
    seen.active = False  # counting starts once the run is built
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code
            if seen.active and caller.co_filename.startswith(PACKAGE):
                seen[f"{_name} in {Path(caller.co_filename).name}:{caller.co_name}"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return seen


def run_steps(cfg: TrainConfig, steps: int, seen: Counter):
    cfg = cfg.resolved()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    stepper = build(cfg, device).step
    seen.active = True
    for _ in range(steps):
        stepper.run()
    return seen


@pytest.mark.parametrize("chunk", [None, 4])
def test_supervised_step_reads_the_device_once(host_reads, chunk):
    cfg = TrainConfig.flat(task="digits", population=16, hidden=(8,), batch_size=8, steps=3, chunk_size=chunk)
    seen = run_steps(cfg, 3, host_reads)
    assert dict(seen) == {"tolist in base.py:fitness_statistics": 3}


def test_rl_step_reads_fitness_and_checks_termination_every_16_env_steps(host_reads):
    cfg = TrainConfig(task="pendulum", strategy="openai_es", population=8, hidden=(4,), steps=2)
    seen = run_steps(cfg, 2, host_reads)
    assert seen.pop("tolist in base.py:fitness_statistics") == 2
    assert seen.pop("__bool__ in rl.py:rollout") == 2 * (200 // 16)  # the all-done check
    assert not seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_no_device_sync_on_gpu_outside_the_fitness_read(precision):
    cfg = TrainConfig.flat(task="digits", population=64, hidden=(16,), batch_size=16, steps=2, device="cuda").resolved()
    cfg.precision = precision
    built = build(cfg, torch.device("cuda"))
    stepper = built.step
    sigma = stepper.strategy.ask(stepper.state)
    torch.cuda.set_sync_debug_mode("error")
    try:
        result = stepper.population.evaluate(built.task, 1, sigma)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    weights, _ = stepper.strategy.tell(stepper.state, result.fitness, result.sq_norms)
    assert result.fitness.shape == (2, 32) and torch.isfinite(weights).all()  # 64 members: 32 directions, 2 signs
