"""The arguments of :class:`~nesgpu.tasks.generation.GenerationTask`, checked: each mistake named with what was
expected and what was got."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..decode import CompiledDecode

SHAPINGS = ("per_prompt", "none")
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
    if shaping not in SHAPINGS:
        raise ValueError(f"shaping must be one of {list(SHAPINGS)}; got {shaping!r}")
    for label, value in {**counts, "generations": generations}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be an int >= 1; got {value!r}")
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


def check_measures(kl, eval_generations, correct_at) -> tuple[bool, int]:
    """What the task measures beside its reward: ``kl`` a bool, ``eval_generations`` an int >= 0 (with
    ``correct_at``)."""
    if not isinstance(kl, bool):
        raise TypeError(f"kl must be True or False; got {kl!r}")
    if isinstance(eval_generations, bool) or not isinstance(eval_generations, int) or eval_generations < 0:
        raise ValueError(f"eval_generations must be an int >= 0 (0: no sampled evaluation); got {eval_generations!r}")
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


__all__ = ["FITNESSES", "SHAPINGS", "check_arguments", "check_measures", "check_prompts", "check_sampling"]
