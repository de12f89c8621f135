"""``dtype``: an ES run whose model is held in bfloat16 / float16 keeps float32 master weights, checkpoints
them, and resumes to the straight run's weights; a Hugging Face model is loaded in the dtype asked for."""

import pytest
import torch
from safetensors.torch import load_file

from nesgpu.train import TrainConfig, train
from nesgpu.train.storage.checkpoint import find_checkpoint

FAST = dict(task="digits", population=16, steps=6, hidden=(8,), batch_size=16, sigma=0.05, lr=0.01,
            checkpoint_every=3, log="none")


def quiet(*args, **kwargs):
    pass


def test_a_bf16_run_keeps_float32_masters_and_resumes_to_the_straight_run(tmp_path):
    train(TrainConfig.flat(**FAST, dtype="bfloat16", out=str(tmp_path / "straight")), log=quiet)
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    assert all(v.dtype == torch.bfloat16 for v in straight.values())
    state = torch.load(find_checkpoint(tmp_path / "straight" / "checkpoint") / "state.pt", weights_only=True)
    masters = state["strategy"]["masters"]
    assert masters and all(v.dtype == torch.float32 for v in masters.values())
    for name, value in masters.items():  # the saved weights are the masters' rounding
        assert torch.equal(straight[name], value.to(torch.bfloat16)), name

    train(TrainConfig.flat(**{**FAST, "steps": 3}, dtype="bfloat16", out=str(tmp_path / "split")), log=quiet)
    train(TrainConfig.flat(**FAST, dtype="bfloat16", out=str(tmp_path / "split")), resume=True, log=quiet)
    split = load_file(tmp_path / "split" / "model.safetensors")
    assert all(torch.equal(straight[k], split[k]) for k in straight)
    later = torch.load(find_checkpoint(tmp_path / "split" / "checkpoint") / "state.pt", weights_only=True)
    assert all(torch.equal(masters[k], later["strategy"]["masters"][k]) for k in masters)


def test_a_float32_run_stores_no_masters(tmp_path):
    train(TrainConfig.flat(**FAST, out=str(tmp_path / "fp32")), log=quiet)
    state = torch.load(find_checkpoint(tmp_path / "fp32" / "checkpoint") / "state.pt", weights_only=True)
    assert "masters" not in state["strategy"]
    assert all(v.dtype == torch.float32 for v in load_file(tmp_path / "fp32" / "model.safetensors").values())


@pytest.mark.parametrize("options, match", [
    (dict(dtype="float64"), "dtype"),
    (dict(dtype="bfloat16", strategy="backprop"), "applies to the ES strategies"),
])
def test_bad_dtypes_are_refused(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        train(TrainConfig.flat(**{**FAST, **options}, out=str(tmp_path / "r")), log=quiet)


def test_resume_with_another_dtype_is_refused(tmp_path):
    train(TrainConfig.flat(**{**FAST, "steps": 3}, dtype="bfloat16", out=str(tmp_path / "r")), log=quiet)
    with pytest.raises(ValueError, match="dtype"):
        train(TrainConfig.flat(**FAST, dtype="float16", out=str(tmp_path / "r")), resume=True, log=quiet)

