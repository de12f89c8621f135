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
    ("reward", False, "2", r"under torchrun \(WORLD_SIZE=2\) it is not supported yet"),
])
def test_what_the_vllm_engine_cannot_serve_is_refused(fitness, compile, world, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", world)
    with pytest.raises(ValueError, match=message):
        check_engine("vllm", fitness, compile)
    assert check_engine("hf", fitness, compile) == "hf"
