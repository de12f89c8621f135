"""Every Python snippet in the README runs as written (with fewer loop steps, to keep the suite fast), and
every `nesgpu train` command in it parses and resolves."""

import ast
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_snippets():
    assert len(SNIPPETS) >= 2


def final_label(code: str) -> str | None:
    """The text a snippet's last top-level print starts with (``print("accuracy", ...)``: "accuracy"), if any."""
    prints = [node.value for node in ast.parse(code).body if isinstance(node, ast.Expr)
              and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "print"]
    first = prints[-1].args[0] if prints and prints[-1].args else None
    if isinstance(first, ast.JoinedStr) and first.values:
        first = first.values[0]
    return first.value.split("{")[0] if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a snippet's run directories go there
    code = re.sub(r"range\((\d+), (\d+)\)", r"range(\1, \1 + 3)", SNIPPETS[index])  # the same loops, 3 steps each
    code = re.sub(r"range\((\d+)\)", "range(3)", code)
    exec(compile(code, f"README.md snippet {index}", "exec"), {"__name__": "readme"})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines and lines[-1].startswith(final_label(code) or ""), lines  # it ran to its last print ...
    assert not re.search(r"\b(nan|inf)\b", "\n".join(lines), flags=re.I), lines  # ... and printed finite numbers


def readme_train_commands() -> list[str]:
    """The `nesgpu train` command lines of the README's shell blocks (torchrun's too), comments removed."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if "nesgpu train" in line:
                lines.append(line[line.index("nesgpu train") + len("nesgpu "):])
    return lines


def test_every_readme_train_command_resolves(tmp_path, monkeypatch, capsys):
    import shlex

    from nesgpu.cli import main

    monkeypatch.chdir(tmp_path)
    commands = readme_train_commands()
    assert len(commands) >= 10
    checked = 0
    for line in commands:
        args = shlex.split(line)
        redirect = None
        if ">" in args:
            redirect = args[args.index(">") + 1]
            args = args[:args.index(">")]
        if "--resume" in args:  # needs a finished run; the resume tests cover it
            continue
        if "--config" in args and args[args.index("--config") + 1].endswith("best.yaml"):  # a tune's output
            best = tmp_path / args[args.index("--config") + 1]
            best.parent.mkdir(parents=True, exist_ok=True)
            assert main(["train", "--task", "digits", "--print-config"]) == 0
            best.write_text(capsys.readouterr().out)
        if any(a.startswith("gym:") and "Cheetah" in a for a in args):
            pytest.importorskip("mujoco")
        assert main([*args, "--print-config"]) == 0, line
        out = capsys.readouterr().out
        assert out.startswith("task: "), line
        if redirect:
            (tmp_path / redirect).write_text(out)
        checked += 1
    assert checked >= 10
