"""The API reference (``make docs``: pdoc over the docstrings) builds, covers every public subpackage and
names the public API; the installed version is ``nesgpu.__version__`` (the one version source)."""

import importlib.metadata
import pkgutil
import re
import warnings
from pathlib import Path

import pytest

import nesgpu

ROOT = Path(__file__).resolve().parents[2]


def docs_modules() -> list[str]:
    """The modules `make docs` hands to pdoc: the Makefile's DOCS_MODULES line."""
    found = re.search(r"^DOCS_MODULES\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert found, "the Makefile has no DOCS_MODULES line"
    return found.group(1).split()


@pytest.fixture(scope="module")
def api_docs(tmp_path_factory):
    """Build the reference as `make docs` does; yield (output directory, warnings pdoc raised)."""
    pdoc = pytest.importorskip("pdoc")
    out = tmp_path_factory.mktemp("docs")
    pdoc.render.configure(docformat="google")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pdoc.pdoc(*docs_modules(), output_directory=out)
    finally:
        pdoc.render.configure()  # pdoc's defaults back, for anything else in this process
    yield out, [str(w.message) for w in caught]


def page(out: Path, module: str) -> str:
    path = out / (module.replace(".", "/") + ".html")
    assert path.is_file(), f"no page for {module}"
    return path.read_text()


def test_installed_version_is_the_package_version():
    # pyproject.toml reads nesgpu.__version__ (dynamic); a stale install (no `pip install -e .` since) fails here
    assert importlib.metadata.version("nesgpu") == nesgpu.__version__


def test_every_public_subpackage_has_a_page(api_docs):
    out, _ = api_docs
    packages = [m.name for m in pkgutil.walk_packages(nesgpu.__path__, "nesgpu.")
                if m.ispkg and not any(part.startswith("_") for part in m.name.split("."))]
    assert packages
    missing = [name for name in ["nesgpu", *packages] if not (out / (name.replace(".", "/") + ".html")).is_file()]
    assert not missing, f"add {missing} to DOCS_MODULES in the Makefile"
    assert (out / "index.html").is_file() and (out / "search.js").is_file()


def test_the_build_raises_no_warnings(api_docs):
    _, caught = api_docs  # a module that fails to import, an annotation pdoc cannot resolve, a page twice
    assert not caught, "\n\n".join(caught)


@pytest.mark.parametrize("module, names", [
    ("nesgpu", ["PerturbedModel", "convert", "load_run", "PerturbedLinear", "functional_fallback"]),
    ("nesgpu.kinds", ["Kind", "LowRank", "Permuted", "Flipout", "Sparse", "Gaussian", "make_kind"]),
    ("nesgpu.strategies", ["Strategy", "StrategyState", "OpenAIES", "ARS", "PGPE", "ClipUp", "centered_ranks",
                           "Schedule", "StepSizes"]),
    ("nesgpu.population", ["Population", "Evaluation"]),
    ("nesgpu.train", ["TrainConfig", "train", "load_run", "TASK_DEFAULTS"]),
    ("nesgpu.tasks", ["make_task", "ClassificationTask", "RLTask", "StreamingClassificationTask", "Task", "TaskSpec",
                      "GenerationTask", "DifferentiableTask", "ModelMaker"]),
    ("nesgpu.tasks.envs", ["CartPole", "Pendulum", "Acrobot", "MountainCarContinuous"]),
])
def test_public_names_are_documented(api_docs, module, names):
    html = page(api_docs[0], module)
    missing = [name for name in names if f'<section id="{name}">' not in html]
    assert not missing, f"{module}: no entry for {missing}"


def test_docstrings_are_rendered(api_docs):
    html = page(api_docs[0], "nesgpu")
    assert "evolution strategies for PyTorch" in html  # the package docstring
    # google-style sections become headings, and cross-references become links
    assert '<h6 id="arguments">Arguments:</h6>' in html
    assert re.search(r'<a href="[^"]*#PerturbedModel">', html)
