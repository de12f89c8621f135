"""``--task generation``: a language model fine-tuned on your own prompts and reward functions, in TRL's shapes
(:mod:`nesgpu.tasks.reward_data`), from the command line::

    nesgpu train --task generation --model hf:DIR --prompts train.jsonl --eval-prompts test.jsonl \\
        --reward rewards:correct,rewards:short --reward-weights 1,0.2
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..options import check_options, option
from .adapters import lora_of
from .reward_data import dataset_task, prompt_rows
from .reward_tasks import DEFAULTS, HF, PretrainedGenerationTask, PromptOptions, hf_directory, load_tokenizer, measures
from .spec import TaskContext, TaskSpec
from .user_code import load_function


@dataclass(frozen=True)
class DatasetOptions(PromptOptions):
    """The options of ``--task generation``: the built-in reward tasks' (prompts per step, sampling, fitness),
    and its prompts, reward functions and completions."""

    prompts: str | None = option(None, "JSON lines with a 'prompt' (text or chat); the other columns reach the "
                                       "rewards")
    eval_prompts: str | None = option(None, "held-out rows, as --prompts (default: the training prompts)")
    reward: str | None = option(None, "reward functions (TRL's signature), module:function or file.py:function, "
                                      "comma-separated")
    reward_weights: str | None = option(None, "one weight per reward function, comma-separated (default: 1 each)")
    max_new_tokens: int = option(32, "tokens each completion may have", at_least=1, at_most=1 << 20)
    correct_at: float | None = option(None, "a reward from this on is correct: the metric is then the held-out "
                                            "accuracy (default: the mean reward)")

    def __post_init__(self):
        check_options(self, "task generation")


def _weights(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise ValueError(f"--reward-weights must be comma-separated numbers like 1,0.5; got {text!r}") from None


def make_dataset_task(name: str, where: TaskContext, options: DatasetOptions) -> PretrainedGenerationTask:
    """The generation task of the options' prompts file and reward functions, over ``--model hf:DIR``."""
    if options.prompts is None or options.reward is None:
        raise ValueError("task 'generation' needs --prompts FILE.jsonl (rows with a 'prompt') and --reward "
                         "module:function (TRL's reward signature)")
    directory = hf_directory(where.model)
    # the files and functions first: a mistake in them is named before transformers and the tokenizer load
    rows = prompt_rows(options.prompts, "prompts")
    held = None if options.eval_prompts is None else prompt_rows(options.eval_prompts, "eval prompts")
    functions = [load_function(spec.strip()) for spec in options.reward.split(",")]
    weights = _weights(options.reward_weights)
    if weights is not None and len(weights) != len(functions):
        raise ValueError(f"--reward-weights needs one weight per reward function ({len(functions)}); got "
                         f"{len(weights)}")
    measured = measures(options)
    make = functools.partial(PretrainedGenerationTask, directory, where.dtype, lora=lora_of(options),
                             engine=options.engine)
    return dataset_task(rows, load_tokenizer(directory), functions, weights,
                        eval_data=held, task_class=make, prompts_per_step=options.batch_size,
                        max_new_tokens=options.max_new_tokens, temperature=options.temperature,
                        correct_at=options.correct_at, generations=options.generations, fitness=options.fitness,
                        seed=where.seed, name=name, compile=where.compile, **measured)


TASKS = {"generation": TaskSpec(make_dataset_task, DEFAULTS, models=("hf:DIR",), model_prefix=HF,
                                options=DatasetOptions)}

__all__ = ["DatasetOptions", "TASKS", "make_dataset_task"]
