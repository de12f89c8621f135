"""Tied language models (GPT-2, a tied Qwen2: most small real LMs) through the whole trainer: every
checkpoint, resume, model.safetensors and RUN/hf keeps the tie, from the CLI and from Python."""

import dataclasses
import subprocess
import sys

import pytest
import torch
from conftest import CHARS, char_tokenizer
from safetensors import safe_open

from nesgpu.train import TrainConfig, train
from nesgpu.train.storage.checkpoint import load_weights, save_weights

tf = pytest.importorskip("transformers")
VOCAB = len(CHARS) + 3
TIED = {
    "gpt2": (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=64,
                                                      bos_token_id=1, eos_token_id=1, pad_token_id=0)),
             "transformer.wte.weight", "lm_head.weight"),
    "qwen2": (lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
        eos_token_id=1)), "model.embed_tokens.weight", "lm_head.weight"),
}


def saved(family, directory):
    torch.manual_seed(0)
    model = TIED[family][0]().eval()
    model.save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


def stored_names(path):
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def dense_reward(tmp_path):
    """A prompts file and a reward with spread on a random model (the distinct characters of the completion):
    an exact-answer reward gives such a model no signal, and a step without signal trains nothing."""
    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"prompt": "{a}+{b}="}}\n' for a in range(5) for b in range(4)))
    (tmp_path / "spread.py").write_text("def distinct(completions, **kw):\n"
                                        "    return [len(set(c)) / 10 for c in completions]\n")
    return dict(task="generation", prompts=str(tmp_path / "prompts.jsonl"), reward=f"{tmp_path / 'spread.py'}:distinct")


@pytest.mark.parametrize("family", list(TIED))
def test_a_tied_model_trains_checkpoints_resumes_and_saves_with_its_tie(family, tmp_path):
    hf = saved(family, tmp_path / "model")
    _, table, head = TIED[family]
    cfg = TrainConfig.flat(model=f"hf:{hf}", steps=3, population=4, batch_size=2, eval_every=3, checkpoint_every=1,
                      log="none", out=str(tmp_path / "straight"), **dense_reward(tmp_path))
    train(cfg, log=lambda *a, **k: None)
    train(dataclasses.replace(cfg, steps=2, out=str(tmp_path / "split")), log=lambda *a, **k: None)
    train(dataclasses.replace(cfg, out=str(tmp_path / "split")), resume=True, log=lambda *a, **k: None)
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert head not in stored_names(straight / "model.safetensors")  # stored once, under the table's name
    for run in (straight, split):
        back = tf.AutoModelForCausalLM.from_pretrained(run / "hf", local_files_only=True)
        assert back.get_parameter(head) is back.get_parameter(table)  # transformers ties them again
    a, b = (tf.AutoModelForCausalLM.from_pretrained(run / "hf", local_files_only=True) for run in (straight, split))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    untrained = tf.AutoModelForCausalLM.from_pretrained(hf, local_files_only=True)
    assert not torch.equal(a.get_parameter(table), untrained.get_parameter(table))  # it trained


def test_the_cli_trains_and_resumes_gpt2(tmp_path):
    hf = saved("gpt2", tmp_path / "model")
    run = [sys.executable, "-m", "nesgpu", "train", "--task", "arithmetic", "--model", f"hf:{hf}", "--population",
           "4", "--batch-size", "2", "--log", "none", "--out", str(tmp_path / "run")]
    first = subprocess.run([*run, "--steps", "1"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([sys.executable, "-m", "nesgpu", "train", "--resume", str(tmp_path / "run"), "--steps", "2"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "run" / "hf" / "config.json").is_file()


def test_save_weights_stores_a_shared_tensor_once_and_load_weights_ties_it_again(tmp_path):
    torch.manual_seed(0)
    model = TIED["qwen2"][0]()
    save_weights(model, tmp_path / "w.safetensors")
    assert stored_names(tmp_path / "w.safetensors") == set(model.state_dict()) - {"lm_head.weight"}
    torch.manual_seed(1)
    other = TIED["qwen2"][0]()
    load_weights(other, tmp_path / "w.safetensors")
    assert other.lm_head.weight is other.model.embed_tokens.weight
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), other.state_dict().values()))
