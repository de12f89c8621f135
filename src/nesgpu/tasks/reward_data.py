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

import hashlib
import inspect
import json
import math
import numbers
import stat
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .reward_calls import RewardCalls
from .user_code import load_function, load_object


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSON-lines file (one JSON object per line; blank lines skipped); a ValueError names the
    file and the line of the first bad one."""
    path = Path(path).expanduser()
    try:
        if path.exists() and not stat.S_ISREG(path.stat().st_mode):  # /dev/zero would be read until memory ends
            raise ValueError(f"cannot read the prompts file {path}: not a regular file")
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
        except RecursionError:
            raise ValueError(f"{path}, line {number}: JSON nested too deeply to read") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object with a 'prompt'; got "
                             f"{type(row).__name__}")
        rows.append(row)
    return rows


def prompt_rows(data, what: str = "prompts") -> list[dict]:
    """The rows of ``data`` (a ``datasets.Dataset``, a list of dicts, or a JSON-lines file's path), each with a
    ``prompt`` that is text or a list of messages."""
    if isinstance(data, (str, Path)):
        rows, what = read_jsonl(data), f"{what} ({data})"
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
        if taken := sorted(RESERVED.intersection(row)):
            raise ValueError(f"{what}: row {i} has a column named {taken[0]!r}, a name the reward functions are "
                             f"passed by the trainer itself (TRL's signature); rename the column")
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
    try:
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # the template is the model directory's: jinja2's TemplateError, its SecurityError, ...
        raise ValueError(f"the tokenizer's chat template cannot render the messages {prompt!r:.80} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


EXTRAS = ("completion_ids", "trainer_state", "log_extra", "log_metric")
"""What TRL's GRPOTrainer passes a reward function besides the prompts, completions and columns."""

CONTEXT = {"completion_ids": "completion_ids", "trainer_state": "step"}
"""The extras a GenerationTask must pass :class:`Rewards` something for, and what."""

RESERVED = frozenset({"completions", "prompts"})
"""Keyword names a reward function is always given by the trainer: no data column may take one (a column
named like one of :data:`EXTRAS` is passed instead of the extra)."""


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
        functions: TRL reward functions ``f(completions, prompts=..., **columns) -> list[float | None]``, or
            their names, ``module:function`` or ``file.py:function``.
        weights: one per function (default: 1 each).
        rows: the prompts' rows, by their rendered text.
        eval_rows: the held-out prompts' rows, by their rendered text, where they differ from ``rows``: a
            held-out row whose prompt is also a training prompt reaches the functions with its own columns.

    ``takes_context``: what a :class:`~nesgpu.tasks.generation.GenerationTask` passes it besides the prompts
    and completions, the ones its functions take: the completions' token ids (``completion_ids=``, a sequence
    worked out at its first read) and the step (``step=``, for ``trainer_state``). A dataset column of the
    same name as one of TRL's extras is passed instead of the extra; and, with ``eval_rows``, whether the call
    scores an evaluation (``evaluating=``). ``logged``: what the functions gave ``log_metric`` (name ->
    values) and ``log_extra`` (column -> values) in the latest call. A completion no function scores (every
    one returned None) gets 0, with a warning, as TRL's ``nansum`` gives it.
    """

    names_its_errors = True  # each error names the function it is about: GenerationTask passes them on

    def __init__(self, functions: Sequence[Callable], rows: dict[str, dict], weights: Sequence[float] | None = None,
                 eval_rows: dict[str, dict] | None = None):
        functions = [functions] if callable(functions) or isinstance(functions, str) else list(functions)
        functions = [load_function(f) if isinstance(f, str) else f for f in functions]
        if not functions or not all(callable(f) for f in functions):
            raise TypeError(f"reward functions must be callables or module:function names; got "
                            f"{[type(f).__name__ for f in functions]}")
        weights = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
        if len(weights) != len(functions) or not all(math.isfinite(w) for w in weights):
            raise ValueError(f"need one finite weight per reward function ({len(functions)}); got {weights}")
        self.functions, self.weights, self.rows = functions, weights, rows
        self.eval_rows = None if eval_rows is None or eval_rows is rows else eval_rows
        self.takes = [_extras_taken(f) for f in functions]
        self.takes_context = frozenset(CONTEXT[k] for k in frozenset().union(*self.takes) if k in CONTEXT)
        if self.eval_rows is not None:
            self.takes_context |= {"evaluating"}
        self.unscored = 0  # completions no function scored (scored 0, with a warning the first time)
        self.calls = RewardCalls()  # each call awaited, exit() refused, the working directory kept
        self.logged: dict[str, dict] = {"metrics": {}, "extra": {}}
        self._pending: dict[str, list[float]] = {}  # log_metric's values since the last take_metrics()
        self._told = False
        self.names = [getattr(f, "__name__", type(f).__name__) for f in functions]  # TRL's rewards/<name>/...
        self.values: list[list[float | None]] = []  # each function's values in the latest call (None: not scored)
        self.__name__ = "+".join(self.names)

    def __call__(self, prompts: list[str], completions: list[str], completion_ids: Sequence[list[int]] | None = None,
                 step: int = 0, evaluating: bool = False) -> torch.Tensor:
        rows = self._rows_of(prompts, self.eval_rows if evaluating and self.eval_rows is not None else self.rows)
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
        self.values = []
        for f, weight, takes in zip(self.functions, self.weights, self.takes):
            values = self.calls(f, completions=texts, prompts=list(originals),  # its error named (RewardCalls)
                                **{k: list(v) for k, v in columns.items()},
                                **{k: v for k, v in extras.items() if k in takes and k not in columns})
            _add_checked(f, values, weight, total)
            self.values.append([None if v is None else float(v) for v in values])
        self._note_unscored(total, originals)
        return torch.tensor([0.0 if t is None else t for t in total], dtype=torch.float64)

    @staticmethod
    def _rows_of(prompts: list[str], table: dict[str, dict]) -> list[dict]:
        missing = next((p for p in prompts if p not in table), None)
        if missing is not None:
            raise ValueError(f"the rewards hold no row whose prompt renders as {missing!r:.80}; they score the "
                             f"prompts they were built with ({len(table)} rows)")
        return [table[p] for p in prompts]

    def _note_unscored(self, total: list[float | None], prompts: list) -> None:
        """Warn (the first time) that every function returned None for a completion: it scores 0."""
        unscored = [i for i, t in enumerate(total) if t is None]
        if unscored and not self.unscored:
            warnings.warn(f"every reward function returned None for a completion of the prompt "
                          f"{prompts[unscored[0]]!r:.60}: it scores 0, as in TRL (make one function score every "
                          f"completion); this warning is given once", stacklevel=3)
        self.unscored += len(unscored)

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


def rows_by_prompt(rows: list[dict], tokenizer, what: str) -> tuple[dict[str, dict], list[str]]:
    """The rows by their rendered prompt, and every row's rendered prompt in order (a repeated row is kept, as
    TRL keeps it: it is drawn as often as it appears); two rows that render alike but differ in another column
    are an error (the reward could not tell them apart)."""
    by_text: dict[str, dict] = {}
    texts = []
    for i, row in enumerate(rows):
        text = render(row["prompt"], tokenizer)
        if by_text.get(text, row) != row:
            raise ValueError(f"{what}: row {i} has the prompt of an earlier row but other columns; make the prompts "
                             f"unique")
        by_text[text] = row
        texts.append(text)
    return by_text, texts


def dataset_task(data, tokenizer, reward_funcs, reward_weights=None, eval_data=None, task_class=None, **options):
    """A :class:`~nesgpu.tasks.generation.GenerationTask` of TRL-shaped prompts (``data``, and ``eval_data``
    for the held-out ones) and reward functions (one, or a list with ``reward_weights``). ``options`` go to
    the task (``prompts_per_step``, ``max_new_tokens``, ...); ``task_class`` (default GenerationTask) builds
    it."""
    from .generation import GenerationTask

    rows = prompt_rows(data, "prompts")
    held_rows = None if eval_data is None else prompt_rows(eval_data, "eval prompts")
    train, train_prompts = rows_by_prompt(rows, tokenizer, "prompts")
    held, held_prompts = (train, train_prompts) if held_rows is None else \
        rows_by_prompt(held_rows, tokenizer, "eval prompts")
    reward = Rewards(reward_funcs, train, reward_weights, eval_rows=held)
    return (task_class or GenerationTask)(prompts=train_prompts, eval_prompts=held_prompts, reward=reward,
                                          tokenizer=tokenizer, data_fingerprint=fingerprint(rows, held_rows),
                                          **options)


def fingerprint(*values) -> str:
    """A short hash of rows as given (before any chat template renders them: a template may print today's
    date), the same in every process and run: dict keys as text, sets sorted, numpy values as Python's, and
    any other object by its type's name alone (its repr can hold a memory address)."""
    text = json.dumps(_canonical(values), sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical(value):
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if hasattr(value, "tolist"):  # numpy's and torch's scalars and arrays
        return _canonical(value.tolist())
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


__all__ = ["Rewards", "dataset_task", "rows_by_prompt", "load_function", "load_object",
           "prompt_rows", "read_jsonl", "render"]
