"""PEFT adapters: a LoRA model converts with only its adapters evolving (PEFT freezes the base), its
population is exact (forward and greedy generate), and nesgpu.export gives back the PEFT model whose
save_pretrained writes the trained adapter."""

import pytest
import torch

import nesgpu

tf = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def lora_qwen2(seed=0):
    torch.manual_seed(seed)
    base = tf.Qwen2ForCausalLM(tf.Qwen2Config(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0)).eval()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return peft.get_peft_model(base, config)


def inputs():
    ids = torch.randint(3, 61, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_a_lora_model_is_exact_forward_and_greedy_generate():
    report = nesgpu.check(lora_qwen2(), inputs(), max_new_tokens=3)
    assert report.exact, str(report)
    assert report.generate.startswith("exact") and not report.fallback


def test_only_the_adapters_evolve_and_export_saves_the_trained_adapter(tmp_path):
    model = nesgpu.convert(lora_qwen2(), "lowrank")
    pm = nesgpu.PerturbedModel(model, 4, sigma=0.1, antithetic=True)
    names = {id(p): n for n, p in model.named_parameters()}
    evolving = [names[id(p)] for p in pm.parameters()]
    assert evolving and all(".lora_A." in n or ".lora_B." in n for n in evolving)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.SGD(pm.parameters(), lr=0.1)
    pm.set_noise()
    rows = {k: pm.member_rows(v) for k, v in inputs().items()}
    losses = pm(**rows).logits[:, -1].logsumexp(-1).view(-1, 4)  # any fitness, as (signs * samples, D)
    opt.zero_grad()
    pm.update(losses)
    opt.step()
    assert all(torch.equal(p, frozen_before[n]) for n, p in model.named_parameters() if not p.requires_grad)
    plain = nesgpu.export(model)
    assert isinstance(plain, peft.PeftModel)
    plain.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    back = peft.PeftModel.from_pretrained(lora_qwen2().get_base_model(), tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs()).logits, model(**inputs()).logits)


def test_a_lora_run_counts_the_parameters_that_evolve(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from conftest import char_tokenizer

    from nesgpu.tasks.generation import GenerationTask
    from nesgpu.train import TrainConfig, train

    model = lora_qwen2()
    task = GenerationTask(["1+1="], char_tokenizer(), lambda p, c: torch.zeros(len(c)), max_new_tokens=2)
    summary = train(TrainConfig(steps=1, population=2, sigma=0.01, lr=0.01, log="none", out=str(tmp_path / "run")),
                    model=model, task=task, log=lambda *a, **k: None)
    adapters = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    assert summary["parameters"] == adapters < summary["parameters_total"]
    assert summary["parameters_total"] == sum(p.numel() for p in model.parameters())
