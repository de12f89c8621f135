"""Prompts and reward functions in the shapes TRL uses, for a :class:`~nesgpu.tasks.generation.GenerationTask`.

- **Prompts**: a ``datasets.Dataset``, a list of dicts or a JSON-lines file, with a ``prompt`` column. A prompt
  is text, or conversational: a list of ``{"role", "content"}`` messages, rendered with the tokenizer's chat
  template and ``add_generation_prompt=True``.
- **Reward functions**: TRL's signature, ``reward(completions, prompts=..., **columns) -> list[float]``: every
  other column of the prompts' rows reaches each function as a keyword list aligned with the completions
  (a reference ``answer``, say). Completions are text, or, for conversational prompts, a one-message list
  ``[{"role": "assistant", "content": text}]``, as TRL passes them. A function may return None for a
  completion it does not score; several functions are summed with ``weights``, skipping their None values
  (TRL's ``nansum``). A reward function written for ``GRPOTrainer`` runs unchanged: what TRL passes besides
  the columns reaches a function that takes it (by name, or through ``**kwargs``): ``completion_ids`` (each
  completion's token ids as scored, up to and including the token that ends it), ``trainer_state`` (a
  ``transformers.TrainerState`` whose ``global_step`` is the ES step), and ``log_metric`` / ``log_extra``:
  ``log_metric``'s values reach metrics.csv and the trackers (:meth:`Rewards.take_metrics`), and an
  evaluation's ``log_extra`` columns go beside its completions in ``samples.jsonl``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import math
import numbers
import sys
import warnings
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


EXTRAS = ("completion_ids", "trainer_state", "log_extra", "log_metric")
"""What TRL's GRPOTrainer passes a reward function besides the prompts, completions and columns."""

CONTEXT = {"completion_ids": "completion_ids", "trainer_state": "step"}
"""The extras a GenerationTask must pass :class:`Rewards` something for, and what."""


def _extras_taken(function: Callable) -> frozenset[str]:
    """The names of :data:`EXTRAS` that ``function`` takes: all of them through ``**kwargs``."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the columns only
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return frozenset(EXTRAS)
    return frozenset(p.name for p in params if p.name in EXTRAS)


def trainer_state(step: int):
    """TRL's ``trainer_state`` for a reward function at ES step ``step``: transformers' TrainerState."""
    from transformers import TrainerState

    return TrainerState(global_step=int(step))


class Rewards:
    """``reward(prompts, completions) -> tensor`` (what GenerationTask calls) from TRL-style reward functions:
    each row's original prompt and other columns, looked up by its rendered prompt, reach every function.

    Args:
        functions: TRL reward functions ``f(completions, prompts=..., **columns) -> list[float | None]``.
        weights: one per function (default: 1 each).
        rows: the prompts' rows, by their rendered text.

    ``takes_context``: what a :class:`~nesgpu.tasks.generation.GenerationTask` passes it besides the prompts
    and completions, the ones its functions take: the completions' token ids (``completion_ids=``, a sequence
    worked out at its first read) and the step (``step=``, for ``trainer_state``). A dataset column of the
    same name as one of TRL's extras is passed instead of the extra. ``logged``: what the functions gave
    ``log_metric`` (name -> values) and ``log_extra`` (column -> values) in the latest call.
    """

    def __init__(self, functions: Sequence[Callable], rows: dict[str, dict], weights: Sequence[float] | None = None):
        functions = [functions] if callable(functions) else list(functions)
        if not functions or not all(callable(f) for f in functions):
            raise TypeError(f"reward functions must be callables; got {functions!r:.80}")
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
        if len(weights) != len(functions) or not all(math.isfinite(w) for w in weights):
            raise ValueError(f"need one finite weight per reward function ({len(functions)}); got {weights}")
        self.functions, self.weights, self.rows = functions, weights, rows
        self.takes = [_extras_taken(f) for f in functions]
        self.takes_context = frozenset(CONTEXT[k] for k in frozenset().union(*self.takes) if k in CONTEXT)
        self.logged: dict[str, dict] = {"metrics": {}, "extra": {}}
        self._pending: dict[str, list[float]] = {}  # log_metric's values since the last take_metrics()
        self._told = False
        self.__name__ = "+".join(getattr(f, "__name__", "reward") for f in functions)

    def __call__(self, prompts: list[str], completions: list[str], completion_ids: Sequence[list[int]] | None = None,
                 step: int = 0) -> torch.Tensor:
        rows = [self.rows[p] for p in prompts]
        columns = {k: [row.get(k) for row in rows] for k in dict.fromkeys(k for row in rows for k in row)}
        originals = columns.pop("prompt")
        texts = [[{"role": "assistant", "content": c}] if _is_conversation(p) else c
                 for p, c in zip(originals, completions)]
        self.logged = {"metrics": {}, "extra": {}}
        extras = {"trainer_state": trainer_state(step) if "step" in self.takes_context else None,
                  "log_metric": self._log_metric, "log_extra": self._log_extra}
        if completion_ids is not None:
            extras["completion_ids"] = completion_ids
        total: list[float | None] = [None] * len(completions)  # None: no function scored it (NaN)
        for f, weight, takes in zip(self.functions, self.weights, self.takes):
            values = f(completions=texts, prompts=list(originals), **{k: list(v) for k, v in columns.items()},
                       **{k: v for k, v in extras.items() if k in takes and k not in columns})
            _add_checked(f, values, weight, total)
        return torch.tensor([math.nan if t is None else t for t in total], dtype=torch.float64).float()

    def _log_metric(self, name: str, value: float) -> None:
        self._tell("log_metric")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not _is_number(value):
            raise TypeError(f"log_metric({name!r}, value) needs a number; got {type(value).__name__} {value!r:.40}")
        self.logged["metrics"].setdefault(str(name), []).append(value)
        self._pending.setdefault(str(name), []).append(float(value))

    def take_metrics(self) -> dict[str, float]:
        """Each name's mean over what ``log_metric`` got since the last take (TRL averages a logging step's
        values), and a fresh start."""
        taken = {name: math.fsum(values) / len(values) for name, values in self._pending.items()}
        self._pending = {}
        return taken

    def _log_extra(self, column: str, values: list) -> None:
        self._tell("log_extra")
        self.logged["extra"][str(column)] = list(values)

    def _tell(self, what: str) -> None:
        if not self._told:
            self._told = True
            warnings.warn(f"a reward function called {what}: nesgpu writes log_metric's values to metrics.csv and the "
                          f"trackers as log_metric/NAME (a training step's mean; eval_log_metric/NAME at an "
                          f"evaluation; under torchrun the first process's), and log_extra's columns beside the "
                          f"evaluated completions in samples.jsonl", stacklevel=3)


def _is_number(value) -> bool:
    """A real number other than a bool: Python's, or numpy's scalars (which a reward function often returns)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _add_checked(f: Callable, values, weight: float, total: list[float | None]) -> None:
    """total += weight * values where a value is given (None: not scored), values checked."""
    name, n = getattr(f, "__name__", repr(f)), len(total)
    if not isinstance(values, (list, tuple)) or len(values) != n:
        raise ValueError(f"reward function {name} must return a list of {n} floats (or None), one per completion; "
                         f"got {values!r:.80}")
    for i, v in enumerate(values):
        if v is None:
            continue
        if not _is_number(v):
            raise TypeError(f"reward function {name} returned {v!r:.40} for completion {i}; expected a float or None")
        total[i] = (total[i] or 0.0) + weight * float(v)


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
