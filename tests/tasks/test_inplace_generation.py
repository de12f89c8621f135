"""A language model's run with ``update="sgd"`` (the update written into the weights): no ``.grad`` and no float32
master at any step, a checkpoint of the weights alone, and chunked and resumed runs bit-identical to the whole
run, in bfloat16 (stochastic rounding) and float32."""

import pytest
import torch
from conftest import char_tokenizer
from safetensors.torch import load_file
from test_generation import tiny_llama
from test_reward_stats import ROWS, ones, short

from nesgpu.tasks.reward_data import dataset_task
from nesgpu.train import TrainConfig, train
from nesgpu.train.setup.build import build
from nesgpu.train.setup.own_task import resolve_for
from nesgpu.train.storage.checkpoint import find_checkpoint


def task():
    return dataset_task(ROWS, char_tokenizer(), [ones, short], reward_weights=[1.0, 0.5], max_new_tokens=3,
                        prompts_per_step=2, kl=False)


def config(out, steps, dtype, chunk=None, update="sgd"):
    return TrainConfig(task="generation", population=4, sigma=0.05, lr=1e-3, steps=steps, chunk_size=chunk,
                       dtype=dtype, update=update, checkpoint_every=1, out=str(out), log="none")


def quiet(*args, **kwargs):
    pass


def test_a_step_makes_no_grad_and_no_master(tmp_path):
    own = task()
    cfg = resolve_for(config(tmp_path / "r", 2, "bfloat16"), own)
    built = build(cfg, torch.device("cpu"), model=tiny_llama(), task=own, log=quiet)
    start = {name: p.detach().clone() for name, p in built.model.named_parameters()}
    for _ in range(2):
        built.step.run()
        assert all(p.grad is None for p in built.model.parameters())
    params = list(built.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    assert built.pm.master_state() == {} and built.step.optimizer.state_dict()["state"] == {}
    assert all(a is b for a, b in zip(built.step.population.parameters(), params))  # the weights themselves step
    assert any(not torch.equal(p, start[name]) for name, p in built.model.named_parameters())
    assert "masters" not in built.step.state_dict()


@pytest.mark.parametrize("dtype, update", [("bfloat16", "sgd"), ("float32", "sgd"), ("bfloat16", "adam")])
def test_chunked_and_resumed_runs_are_bit_identical_to_the_whole_run(tmp_path, dtype, update):
    def run(name, steps, chunk=None, resume=False):
        train(config(tmp_path / name, steps, dtype, chunk, update), model=tiny_llama(), task=task(), resume=resume,
              log=quiet)

    run("whole", 3)
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    run("chunked", 3, chunk=1)
    run("split", 2)
    run("split", 3, resume=True)
    state = torch.load(find_checkpoint(tmp_path / "split" / "checkpoint") / "state.pt", weights_only=True)
    moments = state["strategy"]["optimizer"]["state"]
    assert "masters" not in state["strategy"]
    assert (moments == {}) if update == "sgd" else all(v.dtype == getattr(torch, dtype) for m in moments.values()
                                                       for v in m.values())
    for run_name in ("chunked", "split"):
        other = load_file(tmp_path / run_name / "model.safetensors")
        assert other.keys() == whole.keys()
        for name in whole:
            assert torch.equal(whole[name], other[name]), (run_name, name)
    assert any(not torch.equal(whole[name], p.detach().to(whole[name].dtype))
               for name, p in tiny_llama().named_parameters())  # it trained


def test_a_run_from_before_update_resumes_from_the_command_line_with_its_optimizer(tmp_path):
    import json
    import subprocess
    import sys

    from test_generation import saved_model

    hf = saved_model(tmp_path / "tiny")
    args = ["train", "--task", "arithmetic", "--model", f"hf:{hf}", "--population", "4", "--batch-size", "2",
            "--sigma", "0.05", "--lr", "0.01", "--log", "none", "--out", str(tmp_path / "old")]
    done = subprocess.run([sys.executable, "-m", "nesgpu", *args, "--steps", "1", "--update", "strategy"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((tmp_path / "old" / "config.json").read_text())  # as nesgpu wrote it before --update
    del config["update"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    state_path = find_checkpoint(tmp_path / "old" / "checkpoint") / "state.pt"
    state = torch.load(state_path, weights_only=True)
    del state["config"]["update"]
    torch.save(state, state_path)
    done = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--resume", str(tmp_path / "old"), "--steps",
                           "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "old" / "config.json").read_text())["update"] == "strategy"
