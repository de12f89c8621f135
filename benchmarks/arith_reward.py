"""The arithmetic task's reward in TRL's shape, for the race of benchmarks/lm_vs_grpo.py: the one function that
TRL's ``GRPOTrainer`` and ``nesgpu train --task generation --reward arith_reward:correct`` both call, unchanged."""

from nesgpu.tasks.verifiers import arithmetic_reward


def correct(completions, prompts=None, **columns):
    """1 for the exact answer of each prompt "a+b=" (the completion's first line), 0.1 for another integer,
    else 0; TRL's signature (completions as text)."""
    return [arithmetic_reward(p, c) for p, c in zip(prompts, completions)]


def exact(completions, prompts=None, **columns):
    """A binary reward: 1 for the exact answer, 0 for anything else."""
    return [float(arithmetic_reward(p, c) == 1.0) for p, c in zip(prompts, completions)]
