"""Every Python snippet in the README runs as written (with fewer loop steps, to keep the suite fast)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, capsys):
    code = re.sub(r"range\((\d+), (\d+)\)", r"range(\1, \1 + 3)", SNIPPETS[index])  # the same loops, 3 steps each
    code = re.sub(r"range\((\d+)\)", "range(3)", code)
    exec(compile(code, f"README.md snippet {index}", "exec"), {"__name__": "readme"})
