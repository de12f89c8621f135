"""`nesgpu train --bits`: a low-bit run trains, resumes and chunks like a float run, and its options define it."""

import json

import pytest
import torch
from safetensors.torch import load_file

from nesgpu.cli import main
from nesgpu.layers import LowBitLinear
from nesgpu.train import TrainConfig, evaluate_run, train
from nesgpu.train.setup.build import build

FAST = dict(task="digits", population=16, steps=6, batch_size=8, hidden=(8,))


def quiet(*args, **kwargs):
    pass


@pytest.mark.parametrize("bits, act_bits", [(1, None), (8, None), (8, 8)])
@pytest.mark.parametrize("noise_on", ["latent", "quantized"])
def test_low_bit_run_trains_evaluates_and_chunks(tmp_path, bits, act_bits, noise_on):
    cfg = dict(FAST, bits=bits, noise_on=noise_on, act_bits=act_bits)
    summary = train(TrainConfig.flat(**cfg, out=str(tmp_path / "whole")), log=quiet)
    assert (summary["bits"], summary["noise_on"], summary["act_bits"]) == (bits, noise_on, act_bits)
    _, model, pm, _ = build(TrainConfig.flat(**cfg).resolved(), torch.device("cpu"))
    assert sum(isinstance(m, LowBitLinear) for m in model.modules()) == 2
    # eval rebuilds the low-bit model from the run's config and reproduces the summary
    assert evaluate_run(tmp_path / "whole", "cpu")["value"] == pytest.approx(summary["value"])
    train(TrainConfig.flat(**cfg, chunk_size=3, out=str(tmp_path / "chunked")), log=quiet)
    a = load_file(tmp_path / "whole" / "model.safetensors")
    b = load_file(tmp_path / "chunked" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_resumed_low_bit_run_equals_a_straight_one_and_keeps_its_bits(tmp_path, capsys):
    cfg = dict(FAST, bits=1, checkpoint_every=2)
    train(TrainConfig.flat(**cfg, out=str(tmp_path / "straight")), log=quiet)
    train(TrainConfig.flat(**{**cfg, "steps": 3}, out=str(tmp_path / "split")), log=quiet)
    train(TrainConfig.flat(**cfg, out=str(tmp_path / "split")), resume=True, log=quiet)
    a = load_file(tmp_path / "straight" / "model.safetensors")
    b = load_file(tmp_path / "split" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "split" / "config.json").read_text())["bits"] == 1
    # bits defines the run: resuming it as an int8 run, or as a float run, is refused
    for bits in (8, None):
        with pytest.raises(ValueError, match=rf"bits: 1 -> {bits}"):
            train(TrainConfig.flat(**{**cfg, "steps": 8, "bits": bits}, out=str(tmp_path / "split")), resume=True,
                  log=quiet)
    with pytest.raises(SystemExit) as e:
        main(["train", "--resume", str(tmp_path / "split"), "--bits", "8", "--steps", "8"])
    assert e.value.code != 0
    assert "bits: 1 -> 8" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (["--bits", "2"], "invalid choice: 2"),
    (["--bits", "1", "--task", "cartpole"], "bits=1 applies to the supervised tasks' models mlp and cnn"),
    (["--bits", "8", "--task", "reverse"], "got task 'reverse' with model 'transformer'"),
    (["--noise-on", "quantized"], "noise_on='quantized' applies to low-bit layers; add --bits 1 or --bits 8"),
    (["--bits", "1", "--strategy", "backprop"], "option 'bits' (= 1) applies to the ES strategies"),
    (["--act-bits", "8"], "act_bits=8 applies to low-bit layers; add --bits 1 or --bits 8"),
    (["--bits", "8", "--act-bits", "8", "--task", "mnist1d", "--model", "cnn"],
     "act_bits=8 applies to the Linear layers of model mlp"),
])
def test_bad_low_bit_options_are_one_line_errors(tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as e:
        main(["train", *options, "--steps", "1", "--out", str(tmp_path / "run")])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_low_bit_cnn_builds_low_bit_convolutions_and_trains(tmp_path):
    from nesgpu.layers import LowBitConv1d

    cfg = TrainConfig.flat(task="mnist1d", model="cnn", hidden=(4, 4), population=8, steps=2, batch_size=4, bits=1,
                      out=str(tmp_path))
    _, model, _, _ = build(cfg.resolved(), torch.device("cpu"))
    assert sum(isinstance(m, LowBitConv1d) for m in model.modules()) == 2
    assert isinstance(model.head, LowBitLinear)
    summary = train(cfg, log=quiet)
    assert summary["bits"] == 1 and 0 <= summary["value"] <= 1


def test_a_run_of_an_older_nesgpu_was_float_and_cannot_be_resumed_as_low_bit(tmp_path):
    """config.json and the checkpoint of a run written before --bits lack the low-bit options: the run had
    float weights, so resuming it with --bits is refused, and resuming it as it was works."""
    out = tmp_path / "old"
    cfg = dict(FAST, checkpoint_every=2, steps=4)
    train(TrainConfig.flat(**cfg, out=str(out)), log=quiet)
    config = json.loads((out / "config.json").read_text())
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
    for key in ("bits", "noise_on", "act_bits"):
        del config[key], state["config"][key]
    (out / "config.json").write_text(json.dumps(config))
    torch.save(state, out / "checkpoint" / "state.pt")
    with pytest.raises(ValueError, match=r"bits: None -> 1"):
        train(TrainConfig.flat(**{**cfg, "steps": 6}, bits=1, out=str(out)), resume=True, log=quiet)
    summary = train(TrainConfig.flat(**{**cfg, "steps": 6}, out=str(out)), resume=True, log=quiet)
    assert summary["steps"] == 6 and "bits" not in summary
    assert evaluate_run(out, "cpu")["value"] == pytest.approx(summary["value"])
