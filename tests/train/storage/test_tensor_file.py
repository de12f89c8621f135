"""safetensors written tensor by tensor: what safetensors itself reads back, every dtype it stores, 0-dim and empty
tensors, metadata; a checkpoint's weights load into the model batch by batch."""

import io

import pytest
import torch
from safetensors.torch import load

from nesgpu.train.storage import tensor_file
from nesgpu.train.storage.checkpoint import load_weights, save_weights
from nesgpu.train.storage.tensor_file import NAMES, write_tensors


def test_safetensors_reads_what_is_written_for_every_dtype():
    tensors = {str(dtype): torch.arange(6.0).view(3, 2).to(dtype) for dtype in NAMES}
    tensors.update(empty=torch.zeros(0, 4), scalar=torch.tensor(3.5), strided=torch.arange(12.0).view(3, 4).t())
    f = io.BytesIO()
    write_tensors(f, tensors, {"key": "value"})
    back = load(f.getvalue())
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(back[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
    with pytest.raises(TypeError, match="safetensors stores no"):
        write_tensors(io.BytesIO(), {"x": torch.zeros(2, dtype=torch.complex128)})


def test_a_model_loads_batch_by_batch(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Linear(20, 5))
    save_weights(model, tmp_path / "w.safetensors")
    monkeypatch.setattr(tensor_file, "LOAD_BYTES", 1000)  # one batch a tensor or two
    other = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Linear(20, 5))
    load_weights(other, tmp_path / "w.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    wrong = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Linear(20, 6))
    with pytest.raises(ValueError, match="shape"):
        load_weights(wrong, tmp_path / "w.safetensors")
