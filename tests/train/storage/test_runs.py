"""A loaded run is the run its files describe: config.json and the weights' own record agree, and weights of
another dtype than the model's are refused, never cast."""

import json

import pytest
import torch

from nesgpu.cli import main
from nesgpu.train import TrainConfig, train
from nesgpu.train.storage.runs import load_run

RUN = dict(task="digits", population=8, steps=2, hidden=(8,))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    train(TrainConfig.flat(**RUN, out=str(out)), log=lambda *a, **k: None)
    return out


def copy_of(run, tmp_path):
    import shutil
    shutil.copytree(run, tmp_path / "copy")
    return tmp_path / "copy"


def test_a_config_json_that_another_run_wrote_is_refused(finished, tmp_path, capsys):
    run = copy_of(finished, tmp_path)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "bits": 1}))  # the weights are float, not binary
    with pytest.raises(ValueError, match=r"config.json does not describe the run that saved model.safetensors "
                                         r"\(bits: None -> 1"):
        load_run(run, device="cpu")
    with pytest.raises(SystemExit) as stop:
        main(["eval", str(run)])
    assert stop.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_weights_of_another_dtype_are_refused_not_cast(finished, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    run = copy_of(finished, tmp_path)
    with safe_open(str(run / "model.safetensors"), "pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    name = next(iter(tensors))
    save_file({**tensors, name: tensors[name].to(torch.int32)}, str(run / "model.safetensors"), metadata=metadata)
    with pytest.raises(ValueError, match=rf"do not match the model's dtypes \({name}: torch.int32 in the file, "
                                         rf"torch.float32 in the model\)"):
        load_run(run, device="cpu")


def test_the_run_as_saved_loads(finished):
    model, task, config = load_run(finished, device="cpu")
    assert config.hidden == (8,) and 0.0 <= task.evaluate(model) <= 1.0
