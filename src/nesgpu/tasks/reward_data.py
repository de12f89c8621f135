"""Prompts and reward functions in the shapes TRL uses, for a :class:`~nesgpu.tasks.generation.GenerationTask`.

- **Prompts**: a ``datasets.Dataset``, a list of dicts or a JSON-lines file, with a ``prompt`` column. A prompt
  is text, or conversational: a list of ``{"role", "content"}`` messages, rendered with the tokenizer's chat
  template and ``add_generation_prompt=True``.
- **Reward functions**: TRL's signature, ``reward(completions, prompts=..., **columns) -> list[float]``: every
  other column of the prompts' rows reaches each function as a keyword list aligned with the completions
  (a reference ``answer``, say). Completions are text, or, for conversational prompts, a one-message list
  ``[{"role": "assistant", "content": text}]``, as TRL passes them. A function may return None for a
  completion it does not score; several functions are summed with ``weights``, skipping their None values
  (TRL's ``nansum``). A reward function written for ``GRPOTrainer`` runs unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSON-lines file (one JSON object per line; blank lines skipped); a ValueError names the
    file and the line of the first bad one."""
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the prompts file {path}: {getattr(e, 'strerror', None) or e}") from e
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}, line {number}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object with a 'prompt'; got "
                             f"{type(row).__name__}")
        rows.append(row)
    return rows


def prompt_rows(data, what: str = "prompts") -> list[dict]:
    """The rows of ``data`` (a ``datasets.Dataset``, a list of dicts, or a JSON-lines file's path), each with a
    ``prompt`` that is text or a list of messages."""
    if isinstance(data, (str, Path)):
        rows = read_jsonl(data)
    elif hasattr(data, "column_names") or (isinstance(data, Sequence) and not isinstance(data, str)):
        rows = [dict(row) if isinstance(row, dict) else row for row in data]
    else:
        raise TypeError(f"{what} must be a datasets.Dataset, a list of dicts or a .jsonl path; got "
                        f"{type(data).__name__}")
    if not rows:
        raise ValueError(f"{what}: no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "prompt" not in row:
            raise ValueError(f"{what}: row {i} has no 'prompt' column; got {row!r:.80}")
        prompt = row["prompt"]
        if not (isinstance(prompt, str) and prompt) and not _is_conversation(prompt):
            raise ValueError(f"{what}: row {i}'s prompt must be non-empty text or a list of {{'role', 'content'}} "
                             f"messages; got {prompt!r:.80}")
    return rows


def _is_conversation(prompt) -> bool:
    return (isinstance(prompt, list) and bool(prompt)
            and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in prompt))


def render(prompt, tokenizer) -> str:
    """A row's prompt as the text the model continues: text as it is; messages through the tokenizer's chat
    template, with the assistant's turn opened."""
    if isinstance(prompt, str):
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("conversational prompts need a tokenizer with a chat template (tokenizer.chat_template); "
                         "this one has none: give the prompts as text")
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


class Rewards:
    """``reward(prompts, completions) -> tensor`` (what GenerationTask calls) from TRL-style reward functions:
    each row's original prompt and other columns, looked up by its rendered prompt, reach every function.

    Args:
        functions: TRL reward functions ``f(completions, prompts=..., **columns) -> list[float | None]``.
        weights: one per function (default: 1 each).
        rows: the prompts' rows, by their rendered text.
    """

    def __init__(self, functions: Sequence[Callable], rows: dict[str, dict], weights: Sequence[float] | None = None):
        functions = [functions] if callable(functions) else list(functions)
        if not functions or not all(callable(f) for f in functions):
            raise TypeError(f"reward functions must be callables; got {functions!r:.80}")
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
        if len(weights) != len(functions) or not all(math.isfinite(w) for w in weights):
            raise ValueError(f"need one finite weight per reward function ({len(functions)}); got {weights}")
        self.functions, self.weights, self.rows = functions, weights, rows
        self.__name__ = "+".join(getattr(f, "__name__", "reward") for f in functions)

    def __call__(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        rows = [self.rows[p] for p in prompts]
        columns = {k: [row.get(k) for row in rows] for k in dict.fromkeys(k for row in rows for k in row)}
        originals = columns.pop("prompt")
        texts = [[{"role": "assistant", "content": c}] if _is_conversation(p) else c
                 for p, c in zip(originals, completions)]
        total = torch.zeros(len(completions), dtype=torch.float64)
        scored = torch.zeros(len(completions), dtype=torch.bool)
        for f, weight in zip(self.functions, self.weights):
            values = f(completions=texts, prompts=list(originals), **{k: list(v) for k, v in columns.items()})
            name = getattr(f, "__name__", repr(f))
            if not isinstance(values, (list, tuple)) or len(values) != len(completions):
                raise ValueError(f"reward function {name} must return a list of {len(completions)} floats (or None), "
                                 f"one per completion; got {values!r:.80}")
            for i, v in enumerate(values):
                if v is None:
                    continue
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise TypeError(f"reward function {name} returned {v!r:.40} for completion {i}; expected a "
                                    f"float or None")
                total[i] += weight * float(v)
                scored[i] = True
        return torch.where(scored, total, torch.full_like(total, math.nan)).float()


def load_function(spec: str) -> Callable:
    """A function from ``module:name`` (importable, the current directory first) or ``path/file.py:name``; a
    ValueError says what is missing."""
    function = load_object(spec, "reward function", kind="function")
    if not callable(function):
        raise ValueError(f"reward function {spec!r}: {spec.rpartition(':')[0]} has no function "
                         f"{spec.rpartition(':')[2]!r} (it is a {type(function).__name__})")
    return function


def load_object(spec: str, what: str, kind: str = "object"):
    """The object ``module:name`` names (importable, the current directory first) or ``path/file.py:name``;
    ``what`` it is for (and the ``kind`` of object) name it in a ValueError that says what is missing."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"a {what} is given as module:{kind} or file.py:{kind}; got {spec!r}")
    path = Path(module_name).expanduser()
    if module_name.endswith(".py") and not path.is_file():
        raise ValueError(f"{what} {spec!r}: no file {path}")
    try:
        if module_name.endswith(".py"):
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")
            module = importlib.import_module(module_name)
    except Exception as e:  # the user's module: its own error, in one line
        raise ValueError(f"{what} {spec!r}: cannot import {module_name!r} ({type(e).__name__}: {e})") from e
    if not hasattr(module, name):
        raise ValueError(f"{what} {spec!r}: {module_name} has no {kind} {name!r}")
    return getattr(module, name)


def rows_by_prompt(rows: list[dict], tokenizer, what: str) -> dict[str, dict]:
    """The rows by their rendered prompt; two rows that render alike but differ in another column are an error
    (the reward could not tell them apart)."""
    by_text: dict[str, dict] = {}
    for i, row in enumerate(rows):
        text = render(row["prompt"], tokenizer)
        if by_text.get(text, row) != row:
            raise ValueError(f"{what}: row {i} has the prompt of an earlier row but other columns; make the prompts "
                             f"unique")
        by_text[text] = row
    return by_text


def dataset_task(data, tokenizer, reward_funcs, reward_weights=None, eval_data=None, task_class=None, **options):
    """A :class:`~nesgpu.tasks.generation.GenerationTask` of TRL-shaped prompts (``data``, and ``eval_data``
    for the held-out ones) and reward functions (one, or a list with ``reward_weights``). ``options`` go to
    the task (``prompts_per_step``, ``max_new_tokens``, ...); ``task_class`` (default GenerationTask) builds
    it."""
    from .generation import GenerationTask

    train = rows_by_prompt(prompt_rows(data, "prompts"), tokenizer, "prompts")
    held = train if eval_data is None else rows_by_prompt(prompt_rows(eval_data, "eval prompts"), tokenizer,
                                                          "eval prompts")
    reward = Rewards(reward_funcs, {**held, **train}, reward_weights)
    return (task_class or GenerationTask)(prompts=list(train), eval_prompts=list(held), reward=reward,
                                          tokenizer=tokenizer, **options)


__all__ = ["Rewards", "dataset_task", "rows_by_prompt", "load_function", "load_object",
           "prompt_rows", "read_jsonl", "render"]
