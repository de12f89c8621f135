"""The compiled static-cache decode of a population's generate(): exact against every member's own eager
generate() in float64, no recompile for a new step's noise or sigma, and a generation task's fitness the
same compiled as eager. Each test compiles a small model once (tens of seconds on a 2-core CPU)."""

import warnings

import pytest
import torch
from conftest import CHARS, char_tokenizer

import nesgpu
from nesgpu.decode import CompiledDecode
from nesgpu.population import Population
from nesgpu.tasks.generation import GenerationTask
from nesgpu.tasks.verifiers import arithmetic_problems

tf = pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])  # tied, Conv1D and biases; RMSNorm, rotary, GQA
def test_the_compiled_decode_is_every_members_own_generate(model_type):
    from hf_zoo import build_small, example_inputs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = build_small(model_type)
        report = nesgpu.check(model, example_inputs(model, 2), directions=2, max_new_tokens=3, compile=True)
    assert report.exact, str(report)
    assert report.generate.startswith("exact (3 greedy tokens, and 3 sampled") and "compiled decode" in report.generate


def digit_count(prompts, completions):
    return torch.tensor([float(sum(ch.isdigit() for ch in c)) for c in completions])


def tiny_llama():
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=len(CHARS) + 3, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return tf.LlamaForCausalLM(config).double().eval()


def test_a_compiled_task_scores_as_the_eager_one_and_new_noise_does_not_recompile():
    prompts = [p for p, _ in arithmetic_problems(12, seed=0)]  # of several lengths: padded to the longest
    options = dict(prompts=prompts, tokenizer=char_tokenizer(), reward=digit_count, max_new_tokens=4,
                   prompts_per_step=3, shaping="none", correct_at=None, temperature=1.0)
    eager, compiled = GenerationTask(**options), GenerationTask(**options, compile=True)
    pm = nesgpu.PerturbedModel(nesgpu.convert(tiny_llama(), "lowrank", rank=2), 4, sigma=0.5, antithetic=True, seed=1)
    population = Population(pm, log=lambda *a: None)
    with warnings.catch_warnings():  # a recompile after the first step would warn (the compiler's own may, cold)
        warnings.filterwarnings("error", message="the compiled decode compiled")
        for step, sigma in ((0, 0.5), (1, 0.5), (2, 0.2)):
            want, got = population.evaluate(eager, step, sigma), population.evaluate(compiled, step, sigma)
            assert torch.equal(want.fitness, got.fitness), step
            if step == 0:
                graphs = compiled._compiled.graphs
                assert graphs >= 1
    assert compiled._compiled.graphs == graphs  # new noise and a new sigma: the same graphs


def test_bad_options_are_refused():
    options = dict(prompts=["1+1="], tokenizer=char_tokenizer(), reward=digit_count)
    with pytest.raises(TypeError, match="compile must be True, False or a CompiledDecode; got 'yes'"):
        GenerationTask(**options, compile="yes")
    with pytest.raises(ValueError, match="fitness 'likelihood' has none"):
        GenerationTask(**options, compile=True, fitness="likelihood", generations=2, temperature=1.0)
    with pytest.raises(ValueError, match="mode must be one of"):
        CompiledDecode("cpu", mode="fast")


def test_a_model_with_modules_in_the_exact_fallback_is_refused_before_compiling():
    net = nesgpu.convert(tiny_llama(), "lowrank", fallback=["model.layers.0.mlp"])
    pm = nesgpu.PerturbedModel(net, 2, sigma=0.1, antithetic=True)
    task = GenerationTask(prompts=["1+1="], tokenizer=char_tokenizer(), reward=digit_count, compile=True,
                          max_new_tokens=2, prompts_per_step=1)
    with pytest.raises(ValueError, match=r"1 run through the exact fallback \(model.layers.0.mlp\)"):
        Population(pm, log=lambda *a: None).evaluate(task, 0, 0.1)
    assert task._compiled is None  # refused before anything compiled
