"""samples.jsonl, the prompts, completions and rewards of a run's evaluations (one JSON object a line, with its
step): a resumed run keeps the lines up to its checkpoint, as metrics.csv keeps its rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoint import atomic_write_text
from ...files import read_text

LIMIT = 1 << 30  # an evaluation's samples are a few kB to a few MB; a run's thousands of them stay below this


def keep_samples_to(path: Path, step: int, log) -> None:
    """Keep the lines of ``path`` (if there is one) of steps up to ``step``. The last line cut short by a kill is
    dropped with a note to ``log``; any other line that is not a sample, a file that is not UTF-8 text or not a
    regular file, is a ValueError naming the file (and line)."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    lines, kept = read_text(path, LIMIT).splitlines(keepends=True), []
    for number, line in enumerate(lines, 1):
        try:
            if _step(line) <= step:
                kept.append(line)
        except ValueError as e:
            if number < len(lines):
                raise ValueError(f"{path}, line {number}, is not a sample ({e}); move the file away to resume "
                                 f"without it") from None
            log(f"warning: {path}: its last line was cut short (a killed run); it is dropped")
    atomic_write_text(path, "".join(kept))


def _step(line: str) -> int:
    """The step of one line of samples.jsonl; a ValueError where the line is not a sample."""
    try:
        row = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deep") from None
    step = row.get("step") if isinstance(row, dict) else None
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"expected a JSON object with a whole-number 'step'; got {line.strip()!r:.60}")
    return step


__all__ = ["keep_samples_to"]
