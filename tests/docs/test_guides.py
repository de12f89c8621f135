"""Every guide in docs/ runs as written: its Python snippets in order, in one namespace (a guide builds on
its earlier snippets), in a scratch directory."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDES = sorted(p for p in DOCS.glob("*.md") if "```python" in p.read_text())


# what each guide says its snippets print
PRINTS = {"architecture.md": ["BaselineState 1 0.0"], "own_model.md": ["custom:toy test_accuracy"], 
          "own_env.md": ["custom:reach eval_return", "custom:reach-pushes", "gym:Hold-v0"],
          "strategies.md": ["openai_es: rotated ellipsoid", "xnes: rotated ellipsoid", "cma_es: rotated ellipsoid"],
          "hf_models.md": ["custom:sevens mean_reward", "LlamaForCausalLM {\"step\": ",
                           "{'rewards/correct/mean': ", "7 rows, steps 0-6",
                           "True exact (3 greedy tokens, and 3 sampled within"]}


def test_the_guides_are_found():
    assert [p.name for p in GUIDES] == sorted(PRINTS)
    assert (DOCS / "scaling.md").is_file()


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_guide_runs(guide, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "guide"}
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", guide.read_text(), flags=re.S)):
        exec(compile(code, f"{guide.name} snippet {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert all(text in out for text in PRINTS[guide.name]), out


def test_architecture_doc_names_files_and_folders_that_exist():
    text = (DOCS / "architecture.md").read_text()
    root = Path(__file__).resolve().parents[2]
    src = root / "src" / "nesgpu"
    files = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", text))
    folders = set(re.findall(r"`((?:[a-z_]+/)+)`", text))  # `kinds/`, `tests/layers/`
    missing = [n for n in files if not (root / n).is_file() and not list(src.rglob(n))]
    missing += [n for n in folders if not (root / n).is_dir() and not any(p.is_dir() for p in src.rglob(n[:-1]))]
    assert files and folders and not missing, f"docs/architecture.md names {sorted(missing)}, which do not exist"
