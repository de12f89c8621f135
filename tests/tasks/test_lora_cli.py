"""LoRA from the command line, as a TRL user brings it: ``--use-peft --lora-r R`` evolves a new adapter over the
frozen model (the base weights stay bit for bit), the run saves the adapter, and eval and resume rebuild it; a PEFT
adapter directory is a model (``--model hf:DIR``), its base a local directory; a stranger's adapter directory is
data (no hub, no pickle, no code); a bad flag is one line."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import char_tokenizer
from test_generation import tiny_llama

from nesgpu.tasks import make_task
from nesgpu.tasks.reward_tasks import hf_directory, load_causal_lm, load_tokenizer
from nesgpu.train import TrainConfig, load_run, train

tf = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
safetensors = pytest.importorskip("safetensors.torch")


def base_dir(path):
    tiny_llama().save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


def adapter_dir(path, base, **config):
    """A PEFT adapter of ``base`` (trained-looking: B not zero), saved as PEFT saves one, without a tokenizer."""
    torch.manual_seed(1)
    model = peft.get_peft_model(tf.AutoModelForCausalLM.from_pretrained(base), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False, **config))
    model.save_pretrained(path)
    return path, model


def nesgpu(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "nesgpu", *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1"))


def one_line(done, *words):
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and all(w in lines[0] for w in words), done.stderr[-2000:]


def base_weights(state: dict) -> dict:
    """A PEFT model's base tensors under the base model's own names."""
    return {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v for k, v in state.items()
            if "lora_" not in k}


RUN = ["--task", "arithmetic", "--steps", "1", "--population", "8", "--batch-size", "2", "--log", "none"]


def test_use_peft_evolves_only_the_adapter_and_eval_and_resume_rebuild_it(tmp_path):
    base = base_dir(tmp_path / "base")
    before = safetensors.load_file(base / "model.safetensors")
    out = tmp_path / "run"
    done = nesgpu("train", *RUN, "--model", f"hf:{base}", "--use-peft", "--lora-r", "2", "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # r 2 on q_proj and v_proj (TRL's default for a Llama, PEFT's table): A (2 x 32) and B (out x 2) each
    assert summary["parameters"] == 2 * 32 + 32 * 2 + 2 * 32 + 16 * 2 < summary["parameters_total"]
    config = json.loads((out / "config.json").read_text())
    assert (config["use_peft"], config["lora_r"], config["lora_alpha"], config["lora_dropout"]) == (True, 2, 32, 0.0)
    trained = safetensors.load_file(out / "model.safetensors")
    assert base_weights(trained).keys() == before.keys()
    assert all(torch.equal(v, before[k]) for k, v in base_weights(trained).items())  # bit for bit
    assert any(bool(v.any()) for k, v in trained.items() if ".lora_B." in k)  # PEFT starts B at zero: it moved
    saved = json.loads((out / "hf" / "adapter_config.json").read_text())
    assert (saved["r"], saved["lora_alpha"], saved["base_model_name_or_path"]) == (2, 32, str(base.resolve()))
    assert sorted(p.name for p in (out / "hf").glob("adapter_model.*")) == ["adapter_model.safetensors"]
    back = peft.PeftModel.from_pretrained(tf.AutoModelForCausalLM.from_pretrained(base), out / "hf")
    lora = {k: v for k, v in trained.items() if "lora_" in k}
    assert all(torch.equal(back.state_dict()[k], v) for k, v in lora.items())  # the adapter, as PEFT loads it
    evaluated = nesgpu("eval", out)
    assert evaluated.returncode == 0 and json.loads(evaluated.stdout)["metric"] == "accuracy", evaluated.stderr[-2000:]
    resumed = nesgpu("train", "--resume", out, "--steps", "2")
    assert resumed.returncode == 0 and json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == 2, \
        resumed.stderr[-2000:]
    again = safetensors.load_file(out / "model.safetensors")
    assert all(torch.equal(v, before[k]) for k, v in base_weights(again).items())
    one_line(nesgpu("train", "--resume", out, "--steps", "3", "--lora-r", "4"), "lora_r: 2 -> 4")
    # the trained adapter is a model in its turn, and play names what it is for
    follow = nesgpu("train", *RUN, "--model", f"hf:{out / 'hf'}", "--out", tmp_path / "next")
    assert follow.returncode == 0, follow.stderr[-2000:]
    one_line(nesgpu("play", out), "play is for RL runs")


def test_an_adapter_directory_is_a_model_whose_adapter_alone_evolves(tmp_path):
    base = base_dir(tmp_path / "base")
    adapter, reference = adapter_dir(tmp_path / "adapter", base)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    assert hf_directory(f"hf:{adapter}") == adapter
    assert load_tokenizer(adapter).get_vocab() == char_tokenizer().get_vocab()  # none saved with it: the base's
    model = load_causal_lm(adapter)
    assert isinstance(model, peft.PeftModel)
    assert all(("lora_" in n) == p.requires_grad for n, p in model.named_parameters())
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference.eval()(input_ids=ids).logits)
    out = tmp_path / "run"
    summary = train(TrainConfig.flat(task="arithmetic", model=f"hf:{adapter}", steps=1, population=4, batch_size=2,
                                log="none", out=str(out)), log=lambda *a, **k: None)
    assert summary["parameters"] == sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    before = safetensors.load_file(base / "model.safetensors")
    assert all(torch.equal(v, before[k]) for k, v in base_weights(safetensors.load_file(out / "model.safetensors")
                                                                  ).items())
    assert (out / "hf" / "adapter_model.safetensors").is_file() and (out / "hf" / "tokenizer.json").is_file()
    run = load_run(out, "cpu")  # rebuilt from the adapter directory the run names
    trained = safetensors.load_file(out / "model.safetensors")
    assert isinstance(run.model, peft.PeftModel)
    assert all(torch.equal(v, trained[k]) for k, v in run.model.state_dict().items())


def edit(path, **values):
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **values}))


def test_the_adapter_directories_a_stranger_sends_are_refused_by_name(tmp_path):
    base = base_dir(tmp_path / "base")

    def fresh(name):
        return adapter_dir(tmp_path / name, base)[0]

    hub = fresh("hub")
    edit(hub / "adapter_config.json", base_model_name_or_path="meta-llama/Llama-3.2-1B")
    pickled = fresh("pickled")
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    prefix = fresh("prefix")
    edit(prefix / "adapter_config.json", peft_type="PREFIX_TUNING")
    megatron = fresh("megatron")
    edit(megatron / "adapter_config.json", megatron_config={"tensor_model_parallel_size": 1},
         megatron_core="rewards")
    code = fresh("code")
    char_tokenizer().save_pretrained(code)
    edit(code / "tokenizer_config.json", auto_map={"AutoTokenizer": ["tokenization_evil.Slow", None]})
    twice = fresh("twice")
    edit(twice / "adapter_config.json", base_model_name_or_path=str(hub))
    short = fresh("short")
    weights = safetensors.load_file(short / "adapter_model.safetensors")
    safetensors.save_file({k: v for k, v in weights.items() if "layers.0.self_attn.v_proj" not in k},
                          short / "adapter_model.safetensors")
    cases = [(hub, "is not a local model directory .* download the base model and set base_model_name_or_path"),
             (pickled, "adapter_model.bin is a pickle, which nesgpu never loads"),
             (prefix, "peft_type 'PREFIX_TUNING'; nesgpu trains LoRA adapters"),
             (megatron, "has a megatron_config, which has PEFT import the module megatron_core names"),
             (code, "tokenizer_config.json.* auto_map"),
             (twice, "is an adapter itself")]
    for directory, message in cases:
        for load in (lambda: hf_directory(f"hf:{directory}"), lambda: load_causal_lm(directory)):
            with pytest.raises(ValueError, match=message):
                load()
    with pytest.raises(ValueError, match=r"has no weights for \['base_model.model.model.layers.0.self_attn.v_proj"):
        load_causal_lm(short)
    one_line(nesgpu("train", *RUN, "--model", f"hf:{hub}", "--out", tmp_path / "run"), "meta-llama/Llama-3.2-1B",
             "adapter_config.json", "download the base model")
    one_line(nesgpu("train", *RUN, "--model", f"hf:{pickled}", "--out", tmp_path / "run"), "adapter_model.bin",
             "pickle")


def test_a_bad_lora_flag_is_one_line(tmp_path):
    base = base_dir(tmp_path / "base")
    adapter = adapter_dir(tmp_path / "adapter", base)[0]
    run = [*RUN, "--model", f"hf:{base}", "--out", tmp_path / "run"]
    one_line(nesgpu("train", *run, "--lora-r", "8"), "'lora_r' (= 8) applies with --use-peft")
    one_line(nesgpu("train", *run, "--use-peft", "--lora-r", "0"), "'lora_r' must be >= 1; got 0")
    cases = [(dict(lora_alpha=8), r"'lora_alpha' \(= 8\) applies with --use-peft"),
             (dict(use_peft=True, lora_dropout=0.05), "'lora_dropout' .* must be 0: ES scores every member in eval"),
             (dict(use_peft=True, lora_target_modules="q_proj,,v_proj"), "comma-separated"),
             (dict(task="digits", use_peft=True), "'use_peft' .* not to task 'digits'")]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            TrainConfig.flat(**{"task": "arithmetic", "model": f"hf:{base}", **options}).resolved()
    with pytest.raises(ValueError, match="LoRA over .*not found in the base model.*its Linear layers: down_proj"):
        make_task("arithmetic", model=f"hf:{base}", use_peft=True, lora_target_modules="qkv").adapter_shapes()
    with pytest.raises(ValueError, match="is a PEFT adapter already .* drop --use-peft"):
        make_task("arithmetic", model=f"hf:{adapter}", use_peft=True)
    resolved = TrainConfig.flat(task="generation", model=f"hf:{base}", use_peft=True, lora_target_modules="all-linear")
    assert (resolved.resolved().option("lora_r"), resolved.resolved().option("lora_alpha")) == (16, 32)  # TRL's defaults
