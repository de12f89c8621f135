"""A model directory's configs as strangers write them (issue 55): an ``auto_map`` of any value, empty or nested,
is refused before transformers reads it (it failed with AttributeError or IndexError on some), and a
generation_config.json transformers refuses (``max_new_tokens: 0``) is named with its field, not blamed on the
model."""

import json
import subprocess
import sys

import pytest
from test_trust import model_dir

from nesgpu.tasks.reward_tasks import load_causal_lm, load_tokenizer

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("auto_map", [{"AutoConfig": {"x": 1}}, {"AutoTokenizer": [["tokenization_evil.Slow"], None]},
                                      [], {}, "", None, 0])
def test_any_auto_map_is_refused_before_transformers_reads_it(tmp_path, name, auto_map):
    hf = model_dir(tmp_path / "m")
    config = json.loads((hf / name).read_text())
    (hf / name).write_text(json.dumps({**config, "auto_map": auto_map}))
    for load in (load_causal_lm, load_tokenizer):
        with pytest.raises(ValueError, match=f"{hf / name} has an auto_map .*never runs a model directory's code"):
            load(hf)
    assert not (hf / "ran").exists()


def test_a_nested_auto_map_names_the_files_it_would_import(tmp_path):
    hf = model_dir(tmp_path / "m", tokenizer_map={"AutoTokenizer": [["tokenization_evil.Slow"], {"x": "a--b.C"}]})
    with pytest.raises(ValueError, match=r"names code in the model directory \(b\.py, tokenization_evil\.py\)"):
        load_tokenizer(hf)


def test_a_generation_config_transformers_refuses_is_named_with_its_field(tmp_path):
    hf = model_dir(tmp_path / "m")
    config = json.loads((hf / "generation_config.json").read_text())
    (hf / "generation_config.json").write_text(json.dumps({**config, "max_new_tokens": 0}))
    done = subprocess.run([sys.executable, "-m", "nesgpu", "check", "--model", f"hf:{hf}"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"nesgpu check: error: {hf / 'generation_config.json'} holds a generation setting "
                           f"transformers refuses (`max_new_tokens` must be greater than 0, but is 0.)"), line
    assert "holds no causal language model" not in line
