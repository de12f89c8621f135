"""Hugging Face causal LMs (random init from small configs, no downloads): every population row equals the
output of its member's own model, for the model types transformers' families use."""

import copy
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import nesgpu

tf = pytest.importorskip("transformers")

SIGMA = 0.05
VOCAB = 61
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)

FAMILIES = {
    "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                     bos_token_id=1, eos_token_id=2)),
    "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON)),
    "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, tie_word_embeddings=True)),
    "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, head_dim=8)),
    "gemma": lambda: tf.GemmaForCausalLM(tf.GemmaConfig(**COMMON, head_dim=8)),
    "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(**COMMON)),
    "phi3": lambda: tf.Phi3ForCausalLM(tf.Phi3Config(**COMMON)),
    "olmo2": lambda: tf.Olmo2ForCausalLM(tf.Olmo2Config(**COMMON)),
    "gemma3": lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**COMMON, head_dim=8)),  # q_norm on a strided view
    "gpt_neox": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                                               num_hidden_layers=2, num_attention_heads=4)),
    "qwen3_moe": lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
        **COMMON, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)),
    "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)),
    # experts stored (in, out) with biases and a clamped interleaved GLU, a router with a bias, attention sinks
    "gpt_oss": lambda: tf.GptOssForCausalLM(tf.GptOssConfig(**COMMON, head_dim=8, num_local_experts=4,
                                                            num_experts_per_tok=2, layer_types=["sliding_attention",
                                                                                                "full_attention"])),
}
TIED = {"gpt2": ("transformer.wte.weight", "lm_head.weight"), "qwen2": ("model.embed_tokens.weight", "lm_head.weight"),
        "gemma": ("model.embed_tokens.weight", "lm_head.weight")}


def make(family: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = FAMILIES[family]().eval()
    with torch.no_grad():  # norms start at ones and biases at zeros: move them so that every parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def member(net: nn.Module, pm: nesgpu.PerturbedModel, row: int) -> nn.Module:
    """The plain model of the member that population row ``row`` evaluates: theta + sigma s_r z_d."""
    d, r = row % pm.directions, row // pm.directions
    sign = -1.0 if pm.antithetic and r >= 1 else 1.0  # two repeats: + then -
    own = copy.deepcopy(net)
    with torch.no_grad():
        for name, z in pm.dense_noise().items():
            own.get_parameter(name).add_(sign * pm.sigma * z[d])
    return own


def convert_quietly(model, kind="lowrank", **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = nesgpu.convert(model, kind, **options)
    return net, [str(w.message) for w in caught]


@pytest.mark.parametrize("kind", ["lowrank", "gaussian"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_population_rows_equal_each_members_own_model(family, kind):
    net, notes = convert_quietly(make(family), kind, **({"rank": 2} if kind == "lowrank" else {}))
    assert not notes, notes  # every module is batched: no fallback, no kind replaced
    pm = nesgpu.PerturbedModel(net, 4, sigma=SIGMA, antithetic=True, seed=3)
    pm.set_noise()
    padding_rows = sum(m.embedding_dim for m in net.modules()
                       if isinstance(m, nn.Embedding) and m.padding_idx is not None)
    assert pm.num_perturbed == sum(p.numel() for p in net.parameters()) - padding_rows  # tied: counted once
    ids = torch.randint(3, VOCAB, (8, 7))
    logits = pm(input_ids=ids).logits
    for row in range(8):
        ref = member(net, pm, row)(input_ids=ids[row : row + 1]).logits[0]
        torch.testing.assert_close(logits[row], ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())


def test_module_types_of_transformers_get_batched_versions():
    gpt2, _ = convert_quietly(make("gpt2"))
    assert type(gpt2.transformer.h[0].attn.c_attn).__name__ == "PerturbedConv1D"
    gemma, _ = convert_quietly(make("gemma"))
    norm = gemma.model.layers[0].input_layernorm
    assert type(norm).__name__ == "PerturbedGemmaRMSNorm" and norm.rms_offset == 1.0
    assert type(gemma.model.embed_tokens).__name__ == "PerturbedGemmaTextScaledWordEmbedding"
    qwen3, _ = convert_quietly(make("qwen3"))
    assert qwen3.model.layers[0].self_attn.q_norm.rms_offset == 0.0
    moe, _ = convert_quietly(make("qwen3_moe"))
    assert type(moe.model.layers[0].mlp.experts).__name__ == "PerturbedQwen3MoeExperts"
    assert type(moe.model.layers[0].mlp.gate).__name__ == "PerturbedQwen3MoeTopKRouter"
    oss, _ = convert_quietly(make("gpt_oss"))
    layer = oss.model.layers[0]
    modules = (layer.mlp.experts, layer.mlp.router, layer.self_attn, layer.self_attn.q_proj)
    assert [type(m).__name__ for m in modules] == ["PerturbedGptOssExperts", "PerturbedGptOssTopKRouter",
                                                   "PerturbedGptOssAttention", "PerturbedLinear"]


def test_a_bank_stored_in_out_gets_its_update_in_its_own_layout():
    net, _ = convert_quietly(make("gpt_oss"), "lowrank", rank=2)
    pm = nesgpu.PerturbedModel(net, 3, sigma=SIGMA, antithetic=True, seed=1)
    pm.set_noise()
    experts = net.model.layers[0].mlp.experts
    coef = torch.tensor([0.5, -1.0, 2.0])
    dense = experts.dense_noise()
    experts.accumulate_grad(coef)
    for name in ("gate_up_proj", "down_proj", "gate_up_proj_bias"):
        assert dense[name].shape[1:] == experts.get_parameter(name).shape
        torch.testing.assert_close(experts.get_parameter(name).grad, torch.tensordot(coef, dense[name], dims=1))


def test_a_router_that_uses_its_matrix_beyond_a_linear_product_is_an_error():
    class EinsumRouter(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_experts, self.weight = 3, nn.Parameter(torch.randn(3, 4))

        def forward(self, x):
            return torch.einsum("th,eh->te", x.reshape(-1, 4), self.weight).softmax(-1)

    net = nesgpu.convert(nn.Sequential(nn.Linear(4, 4), EinsumRouter()), "lowrank")
    pm = nesgpu.PerturbedModel(net, 2)
    pm.set_noise()
    with pytest.raises(RuntimeError, match="parameter '1.weight' of PerturbedEinsumRouter was read directly and used "
                                           "by einsum during a population call"), pm.perturbing():
        net(torch.randn(2, 5, 4))  # pm(...) would put the parent into the exact fallback (test_layout.py)


@pytest.mark.parametrize("family", list(TIED))
def test_tied_weights_are_one_parameter_with_one_noise(family):
    net, _ = convert_quietly(make(family))
    table, head = TIED[family]
    assert net.get_parameter(table) is net.get_parameter(head)
    pm = nesgpu.PerturbedModel(net, 4, sigma=SIGMA, antithetic=True)
    pm.set_noise()
    assert table in pm.dense_noise() and head not in pm.dense_noise()
    assert sum(p is net.get_parameter(table) for p in pm.parameters()) == 1
    weights = torch.randn(2, 4)
    pm.update(weights)
    coef = (weights[0] - weights[1]) / 2 / (4 * SIGMA)
    expected = torch.tensordot(coef, pm.dense_noise()[table], dims=1)
    torch.testing.assert_close(net.get_parameter(table).grad, expected, rtol=1e-4, atol=1e-6)


def test_a_direct_read_of_a_perturbed_parameter_is_an_error_not_a_silent_result():
    class ReadsTable(nn.Module):  # an embedding whose table is also read as the output head
        def __init__(self):
            super().__init__()
            self.emb, self.mix = nn.Embedding(9, 6), nn.Linear(6, 6)

        def forward(self, ids):
            return nn.functional.linear(self.mix(self.emb(ids)), self.emb.weight)

    net = nesgpu.convert(ReadsTable(), "lowrank")
    pm = nesgpu.PerturbedModel(net, 2)
    pm.set_noise()
    with pytest.raises(RuntimeError, match="parameter 'emb.weight' of PerturbedEmbedding was read directly"), \
            pm.perturbing():
        net(torch.randint(0, 9, (2, 3)))


def test_the_fallback_refuses_rows_it_cannot_assign_to_members():
    class PerSequence(nn.Module):  # its input is not laid out rows-first
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.s

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.odd = nn.Linear(4, 4), PerSequence()

        def forward(self, x):  # (rows, T, 4) -> the fallback sees (T, rows, 4)
            return self.odd(self.lin(x).transpose(0, 1)).transpose(0, 1)

    with pytest.warns(UserWarning, match="fallback"):
        net = nesgpu.convert(Net(), "lowrank")
    pm = nesgpu.PerturbedModel(net, 4)
    pm.set_noise()
    for length in (3, 8):  # 8 tokens are 2 x 4 rows, but a 3-D input is not flattened tokens
        with pytest.raises(ValueError, match=r"neither the population's 4 rows nor their 4 x \d+ tokens flattened"), \
                pm.perturbing():
            net(torch.randn(4, length, 4))


def test_an_rms_norm_of_another_form_takes_the_exact_fallback():
    class ShiftedRMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(4)), 1e-6

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) + 0.1

    with pytest.warns(UserWarning, match=r"ShiftedRMSNorm\) has no batched perturbed version"):
        nesgpu.convert(nn.Sequential(nn.Linear(4, 4), ShiftedRMSNorm()), "lowrank")


def test_import_nesgpu_does_not_import_transformers():
    code = ("import sys, nesgpu; nesgpu.convert(__import__('torch').nn.Linear(2, 2)); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
