"""Reward functions for ``--task generation``, written as for TRL's GRPOTrainer: the completions, then every
other column of the prompts' rows (here ``answer``) as a keyword list, one value per completion.

    nesgpu train --task generation --model hf:runs/lm-demo/model --prompts examples/prompts/train.jsonl \\
        --eval-prompts examples/prompts/test.jsonl --reward examples/prompts/rewards.py:correct --correct-at 1
"""


def correct(completions, answer, **kwargs):
    """1 for the reference answer, else 0."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
