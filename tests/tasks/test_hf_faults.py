"""A local Hugging Face directory that is not what it claims is one error naming it, from Python and from the
CLI (one line, no traceback): config.json not matching the weights, truncated or garbage safetensors, a
pickle that holds no tensors, a tokenizer larger than the embedding, a corrupt config.json, ~nobody. RUN/hf is
written atomically with files 0644."""

import json
import os
import stat
import subprocess
import sys

import pytest
import torch
from conftest import char_tokenizer

from nesgpu.tasks.reward_tasks import PretrainedGenerationTask, hf_directory, load_causal_lm
from nesgpu.train import TrainConfig, train

tf = pytest.importorskip("transformers")


def llama(layers=1, vocab=None):
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=vocab or len(char_tokenizer()), hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=1))


def saved(directory, model=None):
    (model or llama()).save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


def test_a_config_with_more_layers_than_the_weights_is_refused(tmp_path):
    hf = saved(tmp_path / "m", llama(layers=2))
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"has no weights for \['model.layers.2.*config.json does not describe"):
        load_causal_lm(hf)
    (hf / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(ValueError, match=r"has weights the config has no place for: \['model.layers.1"):
        load_causal_lm(hf)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_safetensors_are_one_error(tmp_path, damage):
    hf = saved(tmp_path / "m")
    weights = hf / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
    with pytest.raises(ValueError, match=f"{hf} holds no causal language model transformers can load"):
        load_causal_lm(hf)


def test_a_pickle_that_is_no_tensor_is_never_run(tmp_path):
    hf = saved(tmp_path / "m")
    (hf / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    payload = f"import pathlib; pathlib.Path({str(marker)!r}).touch()"
    source = f"import torch\nclass Evil:\n    def __reduce__(self):\n        return (exec, ({payload!r},))\n"
    source += f"torch.save({{'w': Evil()}}, {str(hf / 'pytorch_model.bin')!r})\n"
    subprocess.run([sys.executable, "-c", source], check=True)
    with pytest.raises(ValueError, match="holds no causal language model transformers can load"):
        load_causal_lm(hf)
    assert not marker.exists()


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    hf = saved(tmp_path / "m", llama(vocab=8))
    task = PretrainedGenerationTask(hf, prompts=["1+1="], reward=lambda p, c: torch.zeros(len(c)))
    with pytest.raises(ValueError, match=r"has \d+ tokens, but the model's embedding has 8 rows"):
        task.make_model((), "mlp")


def test_a_corrupt_config_or_an_unknown_user_is_named(tmp_path):
    hf = saved(tmp_path / "m")
    (hf / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json cannot be read as JSON"):
        hf_directory(f"hf:{hf}")
    with pytest.raises(ValueError, match="hf:~nobody-at-all/m"):
        hf_directory("hf:~nobody-at-all/m")


def test_from_the_cli_each_is_one_line(tmp_path):
    hf = saved(tmp_path / "m")
    (hf / "model.safetensors").write_bytes(b"\0" * 64)
    result = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--model", f"hf:{hf}",
                             "--steps", "1", "--out", str(tmp_path / "run")], capture_output=True, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode != 0 and "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-2000:]
    assert "holds no causal language model" in lines[0]


def test_run_hf_is_written_whole_with_files_for_everyone_to_read(tmp_path):
    hf = saved(tmp_path / "m")
    out = tmp_path / "run"
    train(TrainConfig.flat(task="arithmetic", model=f"hf:{hf}", steps=1, population=4, batch_size=2, log="none",
                      out=str(out)), log=lambda *a, **k: None)
    files = [p for p in (out / "hf").rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in files)
    assert not list(out.glob(".hf.tmp-*")) and not (out / "hf.prev").exists()


def test_hidden_sizes_for_a_checkpoints_task_are_refused(tmp_path):
    hf = saved(tmp_path / "m")
    with pytest.raises(ValueError, match="option 'hidden' \\(= 8\\) does not apply to task 'arithmetic'"):
        TrainConfig(task="arithmetic", model=f"hf:{hf}", hidden=(8,)).resolved()
    assert TrainConfig(task="arithmetic", model=f"hf:{hf}").resolved().hidden == ()


def test_a_finished_run_evaluates_after_its_source_directory_is_gone(tmp_path):
    import shutil

    from nesgpu.train import load_run
    hf = saved(tmp_path / "m")
    out = tmp_path / "run"
    train(TrainConfig.flat(task="arithmetic", model=f"hf:{hf}", steps=1, population=4, batch_size=2, log="none",
                      out=str(out)), log=lambda *a, **k: None)
    before = load_run(out, "cpu").model.state_dict()
    shutil.rmtree(hf)
    with pytest.warns(UserWarning, match="is gone: rebuilding the model from the run's own copy"):
        run = load_run(out, "cpu")
    assert run.config.model == f"hf:{hf}"  # the run's config as it was
    assert all(torch.equal(before[k], v) for k, v in run.model.state_dict().items())
