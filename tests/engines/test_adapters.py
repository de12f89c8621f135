"""A low-rank member as a LoRA adapter, without an engine: lora_B @ lora_A of every member is its noise at its sign
and sigma (float64, to rounding), in the population's row order; a member's forward through the adapter is the
population's row; what an adapter cannot carry is named, with what would make it one."""

import re

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.engines import adapter_config, check_members, lora_refusal, member_adapters

tf = pytest.importorskip("transformers")


def tiny_llama():
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                            tie_word_embeddings=False)
    return tf.LlamaForCausalLM(config).eval()


def test_each_members_adapter_is_its_noise_at_its_sign_and_sigma():
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama().double(), "lowrank", evolve="matrices", rank=3), 4,
                               sigma=0.25, antithetic=True, seed=1)
    pm.set_noise(step=5)
    names = check_members(pm)
    assert sorted(n.rpartition(".")[2] for n in names) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"])
    members, dense = member_adapters(pm, names), pm.dense_noise()
    assert len(members) == 8
    for i, member in enumerate(members):
        sign, d = (1.0, -1.0)[i // 4], i % 4
        for name in names:
            a = member[f"base_model.model.{name}.lora_A.weight"].double()
            b = member[f"base_model.model.{name}.lora_B.weight"].double()
            assert a.shape[0] == b.shape[1] == 3
            torch.testing.assert_close(b @ a, sign * 0.25 * dense[f"{name}.weight"][d], rtol=1e-6, atol=1e-7)
    assert adapter_config(names, 3)["lora_alpha"] == 3  # scaling 1: the adapter is the noise itself


def test_a_member_through_its_adapter_is_the_populations_row():
    model = tiny_llama()
    pm = nesgpu.PerturbedModel(nesgpu.convert(model, "lowrank", evolve="matrices", rank=2), 2, sigma=0.5,
                               antithetic=True, seed=2)
    pm.set_noise(step=0)
    ids = torch.tensor([[3, 7, 9, 11]])
    with pm.perturbing():
        rows = pm.model(pm.member_rows(ids)).logits  # (sign, direction) rows
    members = member_adapters(pm)
    for i, member in enumerate(members):
        plain = tiny_llama()  # the same weights; each projection plus its adapter's product
        with torch.no_grad():
            for name in check_members(pm):
                key = f"base_model.model.{name}.lora_"
                plain.get_submodule(name).weight += member[key + "B.weight"] @ member[key + "A.weight"]
            torch.testing.assert_close(plain(ids).logits[0], rows[i], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("convert, message", [  # each with the advice that fits it
    (dict(kind="lowrank"), r"module 'model.embed_tokens' \(PerturbedEmbedding\) is perturbed and is not one of the "
                           r"projections .*: evolve only the projections \(--evolve matrices"),
    (dict(kind="gaussian", evolve="matrices"), r"module '.*' \(.*\) takes 'gaussian' noise, not low-rank "
                                               r"\(--layer lowrank\): a LoRA adapter cannot carry it"),
])
def test_what_an_adapter_cannot_carry_is_refused_by_name(convert, message):
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama(), **convert), 2, sigma=0.1, antithetic=True)
    assert re.search(message, lora_refusal(pm))
    with pytest.raises(ValueError, match=message):
        check_members(pm)
    with pytest.raises(TypeError, match="expected a PerturbedModel; got Linear"):
        check_members(nn.Linear(2, 2))
