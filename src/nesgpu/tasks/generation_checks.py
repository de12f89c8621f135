"""The arguments of :class:`~nesgpu.tasks.generation.GenerationTask`, checked: each mistake named with what was
expected and what was got."""

from __future__ import annotations

import inspect
import math
import traceback
from collections.abc import Callable, Sequence

from ..decode import CompiledDecode

REWARD_SHAPINGS = ("per_prompt", "none")
FITNESSES = ("reward", "likelihood")


def check_prompts(prompts, what: str) -> list[str]:
    """``prompts`` as a list of non-empty strings."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(f"{what} must be a non-empty list of strings; got {prompts!r:.80}")
    bad = [p for p in prompts if not isinstance(p, str) or not p]
    if bad:
        raise ValueError(f"{what} must be non-empty strings; got {bad[0]!r:.80}")
    return list(prompts)


def check_arguments(tokenizer, reward, shaping: str, temperature: float, fitness: str, generations: int, compile,
                    correct_at, stop, **counts: int) -> tuple[str, ...]:
    """Refuse a task's arguments that cannot work; the stop strings as a tuple (``"END"`` is one stop)."""
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise ValueError("the tokenizer has no pad token; set one (e.g. tokenizer.pad_token = "
                         "tokenizer.eos_token) so that prompts of different lengths batch")
    if not callable(reward):
        raise TypeError(f"reward must be a function reward(prompts, completions) -> tensor; got {reward!r:.80}")
    if shaping not in REWARD_SHAPINGS:
        raise ValueError(f"shaping must be one of {list(REWARD_SHAPINGS)}; got {shaping!r}")
    for label, value in {**counts, "generations": generations}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be an int >= 1; got {value!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number (0: greedy); got {type(temperature).__name__} {temperature!r}")
    if not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0; got {temperature!r}")
    check_sampling(fitness, generations, temperature)
    if not isinstance(compile, (bool, CompiledDecode)):
        raise TypeError(f"compile must be True, False or a CompiledDecode; got {compile!r}")
    if compile and fitness == "likelihood":
        raise ValueError("compile=True (--compile on) compiles the population's generate(); fitness 'likelihood' "
                         "has none (one teacher-forced forward): use compile=False (--compile auto or off)")
    stop = (stop,) if isinstance(stop, str) else tuple(stop)  # "END" is one stop, not three letters
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be a string or a list of non-empty strings; got {stop!r:.80}")
    if correct_at is not None and (isinstance(correct_at, bool) or not isinstance(correct_at, (int, float))
                                   or not math.isfinite(correct_at)):
        raise ValueError(f"correct_at must be a finite number or None; got {correct_at!r}")
    return stop


# the most completions an evaluation samples per held-out prompt (pass@K): each evaluation holds K x the held-out
# prompts' completions, so a K beyond what pass@K is reported at (1, 10, 100, 1000) is a typo that fills memory
MAX_EVAL_GENERATIONS = 1024


def check_measures(kl, eval_generations, correct_at) -> tuple[bool, int]:
    """What the task measures beside its reward: ``kl`` a bool, ``eval_generations`` an int from 0 to
    ``MAX_EVAL_GENERATIONS`` (with ``correct_at``)."""
    if not isinstance(kl, bool):
        raise TypeError(f"kl must be True or False; got {kl!r}")
    if (isinstance(eval_generations, bool) or not isinstance(eval_generations, int)
            or not 0 <= eval_generations <= MAX_EVAL_GENERATIONS):
        raise ValueError(f"eval_generations must be an int >= 0 and <= {MAX_EVAL_GENERATIONS} (0: no sampled "
                         f"evaluation; K completions per held-out prompt); got {eval_generations!r}")
    if eval_generations and correct_at is None:
        raise ValueError("eval_generations counts correct answers (pass@k): it needs correct_at, the reward from "
                         "which an answer is correct (--correct-at)")
    return kl, eval_generations


def check_sampling(fitness: str, generations: int, temperature: float) -> None:
    if fitness not in FITNESSES:
        raise ValueError(f"fitness must be one of {list(FITNESSES)}; got {fitness!r}")
    if fitness == "likelihood" and (generations < 2 or temperature <= 0):
        raise ValueError(f"fitness 'likelihood' weighs sampled completions: it needs generations >= 2 and a "
                         f"temperature above 0; got generations {generations}, temperature {temperature}")
    if generations > 1 and temperature <= 0:
        raise ValueError(f"generations {generations} needs a temperature above 0 (greedy completions of a prompt "
                         f"are all alike); got temperature {temperature}")


def unreadable(tokenizer, prompts: Sequence[str], what: str = "prompts") -> str | None:
    """A warning's text when ``tokenizer`` turns characters of some of ``prompts`` into its unknown token (the
    model sees them all as one token), naming them; None when it reads every prompt (or has no unknown token:
    byte-level tokenizers). A tokenizer that cannot encode a prompt at all (a word-level one without an unknown
    token fails on a character it has no token for) is a ValueError naming the prompt."""
    try:
        ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception
        bad = next((p for p in prompts if not _encodes(tokenizer, p)), None)
        which = f"the {what}" if bad is None else f"the {what[:-1]} {bad!r:.60}"
        raise ValueError(f"the tokenizer cannot encode {which} ({type(e).__name__}: {e}); expected a tokenizer "
                         f"with a token (or an unknown token) for every character") from None
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return None
    hit = [p for p, row in zip(prompts, ids) if unk in row]
    if not hit:
        return None
    chars = [c for c in sorted(set("".join(hit))) if tokenizer(c, add_special_tokens=False)["input_ids"] == [unk]]
    return (f"{len(hit)} of {len(prompts)} {what} hold characters the tokenizer does not know, e.g. "
            f"{hit[0]!r:.60}{' (' + ', '.join(map(repr, chars)) + ')' if chars else ''}: the model reads them all as "
            f"one token, {tokenizer.unk_token!r}, and is unlikely to learn these prompts; use a model whose "
            f"tokenizer covers their characters")


def _encodes(tokenizer, text: str) -> bool:
    try:
        tokenizer(text, add_special_tokens=False)
    except Exception:  # noqa: BLE001
        return False
    return True


class RewardError(ValueError):
    """A reward function raised: its message names the function, its file and the line it raised at."""


def reward_name(function: Callable) -> str:
    """A reward function as ``module:name`` (a callable object by its class)."""
    owner = function if hasattr(function, "__qualname__") else type(function)
    return f"{getattr(owner, '__module__', None) or '?'}:{owner.__qualname__}"


def reward_error(function: Callable, error: BaseException) -> RewardError:
    """A :class:`RewardError` for ``error``, raised by the reward function ``function``, in one line: the
    function as ``module:name``, what it raised, and the last line of the traceback in the function's own file
    (the innermost line where the function's file has none: a builtin, a callable object)."""
    name = reward_name(function)
    code = getattr(inspect.unwrap(function), "__code__", None)
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if code is not None and f.filename == code.co_filename]
    where = (own or frames or [None])[-1]
    place = f" (at {where.filename}, line {where.lineno})" if where is not None else ""
    message = " ".join(str(error).split())  # one line
    return RewardError(f"the reward function {name} raised {type(error).__name__}"
                       f"{': ' + message if message else ''}{place}")


__all__ = ["FITNESSES", "MAX_EVAL_GENERATIONS", "REWARD_SHAPINGS", "RewardError", "check_arguments",
           "check_measures", "check_prompts", "check_sampling", "reward_error", "reward_name", "unreadable"]
