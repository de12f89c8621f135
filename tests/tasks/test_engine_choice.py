"""Which engine a generation task's population generates on: hf or vllm, and the combinations vllm cannot serve,
refused before any model loads."""

import pytest

from nesgpu.tasks.engine_generation import check_engine


def test_the_engine_is_one_of_hf_and_vllm():
    assert check_engine("hf", "likelihood", True) == "hf" and check_engine("vllm", "reward", False) == "vllm"
    with pytest.raises(ValueError, match=r"engine must be one of \['hf', 'vllm'\]; got 'tgi'"):
        check_engine("tgi", "reward", False)


@pytest.mark.parametrize("fitness, compile, world, message", [
    ("likelihood", False, "1", "--fitness likelihood generates none from the members"),
    ("reward", True, "1", "--compile on compiles transformers' decode"),
    ("reward", False, "2", r"under torchrun \(WORLD_SIZE=2\) runs on CPUs only for now"),
])
def test_what_the_vllm_engine_cannot_serve_is_refused(fitness, compile, world, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # torchrun's ranks on GPUs
    with pytest.raises(ValueError, match=message):
        check_engine("vllm", fitness, compile)
    assert check_engine("hf", fitness, compile) == "hf"


def test_torchrun_on_cpus_may_generate_on_vllm(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert check_engine("vllm", "reward", False) == "vllm"


def test_the_models_generation_config_reaches_vllm_or_is_refused_by_name():
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from nesgpu.tasks.engine_generation import vllm_sampling

    model = SimpleNamespace(generation_config=GenerationConfig(top_p=0.9))
    assert vllm_sampling(model, 0.0) == {}  # greedy: transformers' generate() drops top_p too
    assert vllm_sampling(model, 0.7) == {"top_p": 0.9}
    assert vllm_sampling(SimpleNamespace(generation_config=GenerationConfig()), 0.7) == {}
    for setting in (dict(no_repeat_ngram_size=3), dict(repetition_penalty=1.1)):
        name, value = next(iter(setting.items()))
        with pytest.raises(ValueError, match=f"generation_config sets {name}={value}, which --engine vllm does not"):
            vllm_sampling(SimpleNamespace(generation_config=GenerationConfig(**setting)), 0.0)
