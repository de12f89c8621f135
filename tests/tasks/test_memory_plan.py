"""The memory plan of a language-model run: read from the model directory's headers before the weights load,
printed at the start, used by chunk "auto", and a run that cannot fit is refused in one line before loading."""

import subprocess
import sys

import pytest
import torch
from conftest import char_tokenizer
from test_generation import tiny_llama

from nesgpu.train import TrainConfig, train
from nesgpu.train.setup import memory_plan
from nesgpu.train.setup.memory_plan import plan_run, tensor_shapes

pytest.importorskip("transformers")


def model_dir(path, dtype=torch.float32):
    model = tiny_llama().to(dtype)
    model.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path, model


def config(hf, **options):
    return TrainConfig.flat(**{"task": "arithmetic", "model": f"hf:{hf}", "steps": 1, "population": 4, "batch_size": 2,
                          "log": "none", **options})


def test_the_plan_counts_the_directory_s_weights_and_nothing_an_in_place_run_does_not_hold(tmp_path):
    hf, model = model_dir(tmp_path / "m", torch.bfloat16)
    cfg = config(hf).resolved()
    assert cfg.update == "sgd" and cfg.option("kl") is False  # the language-model defaults: the memory of inference
    shapes = tensor_shapes(hf)
    assert len(shapes) == len(model.state_dict()) and all(dtype == torch.bfloat16 for _, dtype in shapes)
    plan = plan_run(cfg, hf, None, torch.device("cpu"))
    assert plan.parameters == sum(p.numel() for p in model.parameters())
    assert plan.weights == 2 * plan.parameters
    assert plan.masters == plan.grad == plan.optimizer == plan.start == 0
    adam = plan_run(config(hf, update="strategy", anchor=0.01).resolved(), hf, None, torch.device("cpu"))
    # a float32 master (4), its .grad (4), Adam's two moments (8) a parameter; --anchor keeps the starting weights
    assert (adam.masters, adam.grad, adam.optimizer) == (4 * plan.parameters, 4 * plan.parameters,
                                                          8 * plan.parameters)
    assert adam.start == plan.weights and adam.total > plan.total


def test_a_run_prints_its_plan_before_it_loads_the_weights(tmp_path):
    hf, _ = model_dir(tmp_path / "m")
    lines = []
    train(config(hf, out=str(tmp_path / "run")), log=lambda *a, **k: lines.append(" ".join(map(str, a))))
    planned = [line for line in lines if line.startswith("memory plan:")]
    assert len(planned) == 1 and "weights" in planned[0] and "masters" not in planned[0]


def test_a_run_that_cannot_fit_is_one_line_and_loads_nothing(tmp_path, monkeypatch):
    hf, _ = model_dir(tmp_path / "m")
    (tmp_path / "cwd").mkdir()
    env = {"NESGPU_FREE_MEMORY": "1000000", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--model", f"hf:{hf}",
                             "--steps", "1", "--population", "4", "--batch-size", "2", "--log", "none", "--out",
                             str(tmp_path / "run")], capture_output=True, text=True, env=env, cwd=tmp_path / "cwd",
                            timeout=600)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    error = [line for line in result.stderr.splitlines() if "needs" in line]
    assert len(error) == 1 and "has 0.00 GiB free" in error[0] and "weights" in error[0], result.stderr

    def loaded(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setenv("NESGPU_FREE_MEMORY", "1000000")
    monkeypatch.setattr("nesgpu.tasks.reward_tasks.load_causal_lm", loaded)
    with pytest.raises(ValueError, match="needs .* but cpu has"):
        train(config(hf, out=str(tmp_path / "again")), log=lambda *a, **k: None)


def test_chunk_auto_takes_the_plan_s_block(tmp_path, monkeypatch):
    hf, _ = model_dir(tmp_path / "m")
    monkeypatch.setattr(memory_plan, "RUNTIME_CPU", 0)
    cfg = config(hf, chunk_size="auto", population=32).resolved()
    whole = plan_run(cfg, hf, None, torch.device("cpu"))
    assert whole.chunk == cfg.directions  # the machine's memory holds every direction
    per_direction = whole.noise // cfg.directions  # the in-place update draws every direction's noise
    monkeypatch.setenv("NESGPU_FREE_MEMORY", str(whole.total + 3 * per_direction))
    assert plan_run(cfg, hf, None, torch.device("cpu")).chunk == 3  # what is left beside the update's noise


def test_another_strategy_steps_by_its_own_optimizer_and_is_planned_so(tmp_path):
    hf, _ = model_dir(tmp_path / "m")
    cfg = config(hf, strategy="snes", layer="gaussian").resolved()
    assert cfg.update == "strategy"  # the in-place default was the task's own strategy's
    plan = plan_run(cfg, hf, None, torch.device("cpu"))  # snes reads the population's size: given the count
    assert plan.grad == 4 * plan.parameters and plan.optimizer == 0  # plain SGD over .grad: no state
    with pytest.raises(ValueError, match="--update strategy"):
        config(hf, strategy="snes", layer="gaussian", update="sgd").resolved()


@pytest.mark.parametrize("parts, advice", [
    (dict(masters=4, grad=4, optimizer=8), "--update sgd"),
    (dict(start=20), "starting weights"),
    (dict(weights=100), "the weights alone do not fit"),
    (dict(noise=100), "a smaller --population or --chunk-size"),
])
def test_a_run_that_cannot_fit_is_told_what_would_help(monkeypatch, parts, advice):
    from nesgpu.train.setup.memory_plan import MemoryPlan, check_fits

    sizes = dict(parameters=1, weights=2, masters=0, grad=0, optimizer=0, start=0, noise=0, cache=0, workspace=0,
                 runtime=0, chunk=1)
    monkeypatch.setenv("NESGPU_FREE_MEMORY", "10")
    with pytest.raises(ValueError, match=advice):
        check_fits(MemoryPlan(**{**sizes, **parts}), torch.device("cpu"), "this run")


def test_a_lora_run_plans_the_base_it_holds_and_the_adapter_that_evolves(tmp_path):
    pytest.importorskip("peft")
    from nesgpu.train.setup.build import build

    hf, model = model_dir(tmp_path / "m", torch.bfloat16)
    cfg = config(hf, use_peft=True, lora_r=2, update="strategy", anchor=0.01, dtype="bfloat16").resolved()
    built = build(cfg, torch.device("cpu"), log=lambda *a, **k: None)
    shapes = built.task.adapter_shapes()  # from the configs, on the meta device
    assert sorted(shapes) == sorted(tuple(p.shape) for p in built.model.parameters() if p.requires_grad)
    plan = plan_run(cfg, hf, built.task, torch.device("cpu"), shapes)
    adapter = sum(p.numel() for p in built.model.parameters() if p.requires_grad)
    base = sum(p.numel() for p in model.parameters())
    assert plan.evolving == adapter and plan.parameters == base + adapter
    assert plan.weights == 2 * (base + adapter)  # all of it held, in bfloat16
    # masters, .grad, Adam's moments and the starting copy: of the adapter alone, not of the frozen base
    assert (plan.masters, plan.grad, plan.optimizer, plan.start) == (4 * adapter, 4 * adapter, 8 * adapter,
                                                                      2 * adapter)
    assert "of them evolving in a LoRA adapter" in plan.describe()
