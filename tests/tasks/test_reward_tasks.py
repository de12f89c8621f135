"""A local Hugging Face directory loads as the causal LM it holds: through AutoModelForCausalLM, or through the
class its config.json names where transformers' table does not map the config type (Emu3's text model); the
parameters its architecture keeps fixed stay frozen (RoFormer's sinusoidal table, which from_pretrained makes
trainable); a directory that holds none is one ValueError naming it."""

import warnings

import pytest

pytest.importorskip("transformers")
from hf_zoo import build_small  # noqa: E402
from nesgpu.tasks.reward_tasks import load_causal_lm  # noqa: E402


def saved(model_type, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = build_small(model_type)
    if model is None:
        pytest.skip(f"{model_type} cannot be built small here: {why}")
    model.save_pretrained(tmp_path / model_type)
    return model, tmp_path / model_type


def test_a_config_type_the_auto_table_does_not_map_loads_through_its_named_class(tmp_path):
    model, directory = saved("emu3", tmp_path)
    back = load_causal_lm(directory)
    assert type(back) is type(model) and not back.training


def test_parameters_the_architecture_keeps_fixed_stay_frozen(tmp_path):
    model, directory = saved("roformer", tmp_path)
    back = load_causal_lm(directory)
    frozen = [n for n, p in back.named_parameters() if not p.requires_grad]
    assert frozen == ["roformer.encoder.embed_positions.weight"]


def test_a_directory_without_a_model_is_one_error_naming_it(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="holds no causal language model"):
        load_causal_lm(tmp_path)
