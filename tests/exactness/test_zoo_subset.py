"""A fixed representative subset of the causal-LM sweep (benchmarks/hf_sweep.py): every family is exact
(forward, and greedy and sampled KV-cache generate, module by module in float64) or refused with one line;
none differs. The families cover the mechanisms of the sweep: tied embeddings, Conv1D, fused QKV, RMSNorm
forms, scaled embeddings, MoE routers and expert banks (stored (in, out), with biases), attention sinks,
parents reading a child's weight, rows regrouped, tied biases, state-space mixers and gated delta nets whose
caches the fallback splits member by member."""

import warnings

import pytest
import torch

import nesgpu

pytest.importorskip("transformers")
from hf_zoo import build_small, example_inputs  # noqa: E402

EXACT = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "olmo", "olmo2",
         "gpt2", "opt", "falcon", "deepseek_v3", "qwen3_moe", "mixtral", "gpt_neox", "gptj", "bloom", "starcoder2",
         "cohere", "stablelm", "granite", "codegen", "gpt_bigcode", "qwen2_moe", "smollm3", "xglm", "biogpt",
         "llama4_text", "gpt_oss", "granite_swa", "mamba", "qwen3_next", "bamba", "bert", "roberta"]
# popular decoder-only families (and the sink-attention ones): no module in the slow fallback
BATCHED = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi", "phi3", "olmo", "olmo2", "gpt2", "falcon",
           "deepseek_v3", "qwen3_moe", "mixtral", "gpt_oss", "granite_swa"]
FLOAT32 = ["xglm"]  # its attention mask overflows in float64 (transformers' code): checked in float32
REFUSED = ["gemma3n_text"]  # a tie across the module the fallback would need
UNUSED = ["bart"]  # exact; its decoder's cross-attention, which a causal LM never calls, is reported unused


@pytest.mark.parametrize("model_type", EXACT + REFUSED + UNUSED)
def test_a_family_is_exact_or_refused_never_different(model_type):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = build_small(model_type)
        if model is None:
            pytest.skip(f"{model_type} cannot be built small here: {why}")
        report = nesgpu.check(model, example_inputs(model, 2), directions=2, max_new_tokens=2,
                              dtype=torch.float32 if model_type in FLOAT32 else torch.float64)
    if model_type in REFUSED:
        assert report.refused is not None and "\n" not in report.refused.strip(), str(report)
    else:
        assert report.exact, str(report)
        assert report.generate.startswith("exact")
        assert model_type not in BATCHED or not report.fallback, report.fallback
        assert bool(report.unused) == (model_type in UNUSED), report.unused
