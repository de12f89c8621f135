"""The check's ``generate()`` comparisons: greedy (the same tokens as every member's own generate) and sampled
(every step's logits of the population's sampled rows equal their member's own logits along the same tokens,
so each row samples from its own member's distribution). Both run transformers' KV-cache decode on both sides."""

from __future__ import annotations

import torch

from ..decode import CompiledDecode
from .rows import Inputs, compare_rows, each_member, member_index


class _Forced:
    """A logits processor that makes a member's own greedy generate() take the tokens the population sampled
    for its rows (every other token's score -inf): its raw logits along those tokens are then comparable."""

    def __init__(self, tokens: torch.Tensor, prompt: int):
        self.tokens, self.prompt = tokens, prompt

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, self.tokens[:, step, None], 0.0)


def _pad_id(model) -> tuple[dict, int]:
    """generate()'s options for the padding token, and that token."""
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if pad is not None:
        return {}, pad
    pad = getattr(getattr(model, "config", None), "eos_token_id", 0) or 0
    pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    return {"pad_token_id": pad}, pad


def _greedy(reference, pm, inputs: Inputs, rows: Inputs, options: dict, unused: list[str], pad: int,
            compiled: dict) -> str:
    with pm.perturbing(unused):
        population = pm.model.generate(*rows.args, **rows.kwargs, **options, **compiled, do_sample=False)
    for s, d in each_member(reference, pm):
        own = reference.generate(*inputs.args, **inputs.kwargs, **options, do_sample=False)
        mine = population[member_index(s, d, inputs.samples, pm.directions)]
        length = own.shape[-1]  # the member's own run stops when all its samples end; the population's pads them
        if mine.shape[-1] < length or not torch.equal(mine[:, :length], own) or (mine[:, length:] != pad).any():
            return (f"differs: greedy, member (sign {'+-'[s]}, direction {d}) generates {mine.tolist()} instead of "
                    f"{own.tolist()}")
    return ""


def _sampled(reference, pm, inputs: Inputs, rows: Inputs, options: dict, unused: list[str], tolerance: float,
             compiled: dict) -> str:
    from transformers import LogitsProcessorList

    # NaN logits (a small random model whose padded rows poison the rest) cannot be sampled: transformers'
    # InfNanRemoveLogitsProcessor makes them samplable; the raw logits compared are the model's own
    out_options = dict(options, output_logits=True, return_dict_in_generate=True, remove_invalid_values=True)
    devices = [d for d in {p.device for p in pm.model.parameters()} if d.type != "cpu"]
    with torch.random.fork_rng(devices=devices):  # the check's sampling seeded, the caller's RNG untouched
        torch.manual_seed(pm.seed)
        with pm.perturbing(unused):
            population = pm.model.generate(*rows.args, **rows.kwargs, **out_options, **compiled, do_sample=True)
    prompt = population.sequences.shape[1] - len(population.logits)
    logits = torch.stack(population.logits, 1)  # (rows, steps, vocab)
    for s, d in each_member(reference, pm):
        index = member_index(s, d, inputs.samples, pm.directions)
        forced = LogitsProcessorList([_Forced(population.sequences[index, prompt:], prompt)])
        own = reference.generate(*inputs.args, **inputs.kwargs, **out_options, do_sample=False,
                                 logits_processor=forced)
        steps = len(own.logits)  # the member's own run stops when all its samples end
        err = compare_rows(logits[:, :steps], torch.stack(own.logits, 1), index, logits.shape[0])
        same_tokens = torch.equal(own.sequences, population.sequences[index, :prompt + steps])
        if err is None or err > tolerance or not same_tokens:
            return (f"differs: sampled, member (sign {'+-'[s]}, direction {d}): its logits along the population's "
                    f"sampled tokens differ by {err if err is not None else 'shape'} (relative)")
    return ""


def compare_generate(reference, pm, inputs: Inputs, rows: Inputs, max_new_tokens: int, unused: list[str],
                     tolerance: float, compile: bool = False) -> str:
    """"exact (...)" when every member's greedy generate() equals its population rows' and every sampled
    row's logits equal its member's own along the same tokens; else what differs, or why generate() fails.
    With ``compile``, the population's generate() runs the compiled static-cache decode; the members' own
    stay eager."""
    if not hasattr(pm.model, "generate"):
        return "not checked: the model has no generate()"
    pad_options, pad = _pad_id(pm.model)
    options = dict(max_new_tokens=max_new_tokens, **pad_options)
    compiled = CompiledDecode(next(pm.model.parameters()).device).options if compile else {}
    try:
        found = (_greedy(reference, pm, inputs, rows, options, unused, pad, compiled)
                 or _sampled(reference, pm, inputs, rows, options, unused, tolerance, compiled))
    except Exception as e:  # noqa: BLE001 - the model's own generate() may raise anything
        return f"fails: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return found or (f"exact ({max_new_tokens} greedy tokens, and {max_new_tokens} sampled within {tolerance:.0e}; "
                     f"{2 * pm.directions} members{'; compiled decode' if compile else ''})")
