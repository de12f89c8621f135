"""--strategy backprop: the gradient baseline against a hand-written torch loop, accumulation, mixed
precision, activation checkpointing, initialisation, resume, DDP, and its errors."""

import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from nesgpu.distributed import Ranks
from nesgpu.train import TrainConfig
from nesgpu.train.setup.build import build
from nesgpu.train.setup.initialization import init_weights
from nesgpu.train.steps.activations import checkpoint_blocks
from nesgpu.train.steps.backprop import BackpropStep
from nesgpu.train.trainer import train

CPU = torch.device("cpu")


def config(**kw):
    values = dict(task="digits", strategy="backprop", steps=5, hidden=(16,), batch_size=32, device="cpu")
    values.update(kw)
    return TrainConfig.flat(**values).resolved()


def built(**kw):
    cfg = config(**kw)
    task, model, pm, step = build(cfg, CPU)
    assert pm is None
    return cfg, task, model, step.backprop


def test_matches_a_hand_written_torch_loop_bit_for_bit():
    cfg, task, model, bp = built(steps=5, lr=3e-3)
    step = BackpropStep(task, bp, Ranks())
    # the same model and data, trained by plain torch
    _, _, reference, _ = built(steps=5, lr=3e-3)
    opt = torch.optim.AdamW(reference.parameters(), lr=3e-3, weight_decay=0.01)
    for t in range(1, 6):
        stats = step.run()
        x, y = task.batch(t)
        opt.zero_grad()
        loss = F.cross_entropy(reference(x), y)
        loss.backward()
        opt.step()
        assert stats["train_loss"] == pytest.approx(loss.item(), rel=1e-6)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def gradients(model):
    return [p.grad.clone() for p in model.parameters()]


def test_accumulating_n_micro_batches_equals_one_batch_n_times_larger():
    cfg, task, model, bp = built(accumulate=4, batch_size=8, optimizer="sgd", lr=0.1, weight_decay=0.0)
    step = BackpropStep(task, bp, Ranks(), accumulate=4)
    before = [p.detach().clone() for p in model.parameters()]
    step.run()
    accumulated = [b - p.detach() for b, p in zip(before, model.parameters())]  # lr * grad
    # one batch of the same 32 samples
    _, _, reference, _ = built(batch_size=8)
    x, y = zip(*(task.batch(i) for i in range(1, 5)))
    F.cross_entropy(reference(torch.cat(x)), torch.cat(y)).backward()
    for a, p in zip(accumulated, reference.parameters()):
        torch.testing.assert_close(a, 0.1 * p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_close_to_fp32(precision):
    losses = {}
    for p in ("fp32", precision):
        cfg, task, model, bp = built(steps=20)
        step = BackpropStep(task, bp, Ranks(), precision=p)
        losses[p] = [step.run()["train_loss"] for _ in range(20)]
        if p == "fp16":
            assert bp.scaler is not None and "scaler" in bp.state_dict()
    torch.testing.assert_close(torch.tensor(losses[precision]), torch.tensor(losses["fp32"]), rtol=0.03, atol=0.02)
    assert losses[precision][-1] < losses[precision][0]  # it learns


@pytest.mark.parametrize("task, hidden", [("digits", (16, 16)), ("mnist1d", (8, 8)), ("reverse", (16, 2))])
def test_activation_checkpointing_gives_the_same_gradients(task, hidden):
    model_of = {"mnist1d": "cnn"}
    grads = []
    for checkpointing in (False, True):
        cfg, t, model, bp = built(task=task, hidden=hidden, model=model_of.get(task), batch_size=8)
        if checkpointing:
            assert checkpoint_blocks(model) >= 2
            assert set(model.state_dict()) == set(built(task=task, hidden=hidden, model=model_of.get(task))[2]
                                                  .state_dict())
        x, y = t.batch(1)
        t.loss(model, x, y).backward()
        grads.append(gradients(model))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_activation_checkpointing_refuses_a_model_without_blocks():
    with pytest.raises(ValueError, match="no block"):
        checkpoint_blocks(torch.nn.Sequential(torch.nn.Linear(3, 2)))


@pytest.mark.parametrize("scheme", ["he", "xavier"])
def test_init_schemes(scheme):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(400, 300), torch.nn.Tanh(), torch.nn.Linear(300, 10))
    init_weights(model, scheme)
    w = model[0].weight
    expected_std = (2 / 400) ** 0.5 if scheme == "he" else (2 / 700) ** 0.5
    assert w.std().item() == pytest.approx(expected_std, rel=0.05)
    assert torch.count_nonzero(model[0].bias) == 0
    with pytest.raises(ValueError, match="init must be one of"):
        init_weights(model, "orthogonal")


def test_init_applies_to_es_runs_too():
    default = build(TrainConfig(task="digits", hidden=(16,)).resolved(), CPU)[1]
    he = build(TrainConfig(task="digits", hidden=(16,), init="he").resolved(), CPU)[1]
    assert not torch.equal(default[1].weight, he[1].weight)
    assert torch.count_nonzero(he[1].bias) == 0


def test_resume_equals_an_uninterrupted_run(tmp_path):
    common = dict(lr_schedule="cosine", precision="fp16", accumulate=2, steps=12)
    train(config(out=str(tmp_path / "a"), **common), log=lambda *a, **k: None)
    train(config(out=str(tmp_path / "b"), **{**common, "steps": 6}), log=lambda *a, **k: None)
    train(config(out=str(tmp_path / "b"), **common), resume=True, log=lambda *a, **k: None)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_run_learns_and_writes_the_usual_files(tmp_path):
    summary = train(config(out=str(tmp_path / "r"), steps=300, hidden=(32,), lr=5e-3), log=lambda *a, **k: None)
    assert summary["value"] > 0.9 and summary["strategy"] == "backprop" and summary["population"] is None
    for name in ("config.json", "metrics.csv", "model.safetensors", "summary.json", "curve.png"):
        assert (tmp_path / "r" / name).exists()


@pytest.mark.parametrize("kw, message", [
    (dict(task="cartpole"), "supervised tasks"),
    (dict(sigma=0.3), "applies to the ES strategies"),
    (dict(layer_options={"rank": 2}), "applies to the ES strategies"),
    (dict(optimizer="lbfgs"), "optimizer must be one of"),
    (dict(accumulate=0), "option 'accumulate' must be >= 1"),
    (dict(strategy="openai_es", accumulate=2), "applies to strategy 'backprop'"),
    (dict(strategy="openai_es", activation_checkpointing=True), "applies to strategy 'backprop'"),
])
def test_bad_input(kw, message):
    with pytest.raises(ValueError, match=message):
        config(**kw)


def test_backprop_config_round_trips_through_yaml(tmp_path):
    cfg = config(precision="bf16", accumulate=3, activation_checkpointing=True, init="xavier", optimizer="adam")
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert TrainConfig.from_yaml(path).resolved() == cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_match_one(tmp_path):
    args = ["train", "--task", "digits", "--strategy", "backprop", "--steps", "6", "--hidden", "16", "--batch-size",
            "16", "--device", "cpu", "--accumulate", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={free_port()}", "-m", "nesgpu", *args, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "nesgpu", *args, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_ddp_refuses_a_batch_that_does_not_split():
    cfg, task, model, bp = built(batch_size=15)
    with pytest.raises(ValueError, match="does not split evenly"):
        BackpropStep(task, bp, Ranks(rank=0, world=2))


def torchrun(args, out, env):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={free_port()}", "-m", "nesgpu", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_fsdp2_shard_matches_one_process_and_resumes_exactly(tmp_path):
    args = ["train", "--task", "digits", "--strategy", "backprop", "--hidden", "16", "--batch-size", "16",
            "--device", "cpu", "--accumulate", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    sharded = torchrun([*args, "--steps", "6", "--shard"], tmp_path / "sharded", env)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "nesgpu", *args, "--steps", "6", "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "sharded" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    # stopped at step 3 and resumed (the full optimizer state goes back into the shards)
    first = torchrun([*args, "--steps", "3", "--shard"], tmp_path / "resumed", env)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                              f"--master_port={free_port()}", "-m", "nesgpu", "train", "--resume",
                              str(tmp_path / "resumed"), "--steps", "6"], capture_output=True, text=True,
                             timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    c = load_file(tmp_path / "resumed" / "model.safetensors")
    for k in b:
        assert torch.equal(b[k], c[k]), k


def test_shard_alone_warns_and_trains_unsharded(tmp_path):
    with pytest.warns(UserWarning, match="--shard applies to torchrun jobs"):
        summary = train(config(shard=True, out=str(tmp_path / "r")), log=lambda *a, **k: None)
    assert summary["steps"] == 5
    with pytest.raises(ValueError, match="shard: True -> False"):
        train(config(steps=8, out=str(tmp_path / "r")), resume=True, log=lambda *a, **k: None)


def test_fp16_loss_scale_survives_a_resume():
    cfg, task, model, bp = built(precision="fp16")
    BackpropStep(task, bp, Ranks(), precision="fp16").run()
    bp.scaler.update(new_scale=1024.0)  # as after overflows
    state = bp.state_dict()
    _, task2, _, bp2 = built(precision="fp16")
    bp2.load_state_dict(state)
    BackpropStep(task2, bp2, Ranks(), precision="fp16")
    assert bp2.scaler.get_scale() == 1024.0
