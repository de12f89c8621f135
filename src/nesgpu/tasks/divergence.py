"""How far a language model has moved from the model its run started from, and what it may have forgotten: the
comparisons of ES with GRPO on 1-8B models report that ES matches GRPO on the task but drifts further from the base
model and forgets more off-task. Three measures, each under the name its users know:

- ``kl``: the mean per-token KL divergence of the current model from the starting one on completions, by TRL's
  estimator (Schulman's k3: ``exp(r) - r - 1`` with ``r = log p_start - log p_current`` of the sampled token,
  averaged over the completions' tokens), exactly 0 while the model is the starting one. It estimates the KL
  without bias on completions sampled from the current model at the temperature it is taken at; on greedy
  completions (taken at temperature 1) it measures the change at the chosen tokens.
- ``drift_nll``: the mean negative log-likelihood per token of a text the task never trains on (``--drift-text``),
  as ``transformers`` computes a causal LM's loss, and its change from the starting model, ``drift_nll_change``.
- ``pass@k``: the share of prompts of which at least one of ``k`` sampled completions is correct, by the unbiased
  estimator of Chen et al. (2021) from ``n >= k`` samples; ``pass@1`` is the mean share of correct samples.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from pathlib import Path

import torch
from torch import nn

from .likelihood import token_logp

# the float32 logits one forward of kl or drift may hold (bytes): rows are batched below it
LOGITS_BYTES = 1 << 28


def kl_sums(model: nn.Module, start, ids: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor,
            temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the per-token KL estimates, tokens counted) over the rows' kept completion tokens, the current
    ``model`` against its starting weights (``start.loaded()``, swapped in once), both at ``temperature``
    (float64 sums); the rows go through the model in batches whose logits stay below :data:`LOGITS_BYTES`."""
    size = rows_per_forward(model, kept.shape[1] + 1)
    parts = [slice(i, i + size) for i in range(0, ids.shape[0], size)]
    with torch.no_grad():
        current = [token_logp(model, ids[p], mask[p], kept[p], temperature) for p in parts]
        with start.loaded():
            reference = [token_logp(model, ids[p], mask[p], kept[p], temperature) for p in parts]
    ratio = (torch.cat(reference) - torch.cat(current)).double()
    counted = kept.to(ratio.device, torch.float64)
    per_token = (ratio.exp() - ratio - 1) * counted
    return per_token.sum(), counted.sum()


def rows_per_forward(model: nn.Module, positions: int) -> int:
    """Rows of ``positions`` logits each whose float32 logits, with the two copies a log-softmax makes, stay
    below :data:`LOGITS_BYTES` (at least one)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    vocab = weight.shape[0] if weight is not None else getattr(getattr(model, "config", None), "vocab_size", 1) or 1
    return max(1, LOGITS_BYTES // (3 * 4 * vocab * max(1, positions)))


def read_texts(path: str | Path) -> list[str]:
    """The texts of a ``--drift-text`` file: JSON lines with a ``text`` column (``.jsonl``, ``.json``), else one
    text per non-empty line; a ValueError naming the file and line where it is neither."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"drift text {path}: {'not a regular file' if path.exists() else 'no such file'}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"drift text {path}: not UTF-8 text (byte {e.start}); expected lines of text, or JSON "
                         f"lines with 'text'") from None
    if path.suffix not in (".jsonl", ".json"):
        texts = [line for line in lines if line.strip()]
    else:
        texts = [_text_of(line, path, number) for number, line in enumerate(lines, 1) if line.strip()]
    if not texts:
        raise ValueError(f"drift text {path}: no texts")
    return texts


def _text_of(line: str, path: Path, number: int) -> str:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"drift text {path}, line {number}: not JSON ({e})") from None
    if not isinstance(row, dict) or not isinstance(row.get("text"), str) or not row["text"]:
        raise ValueError(f"drift text {path}, line {number}: expected an object with a non-empty 'text' string; got "
                         f"{line!r:.80}")
    return row["text"]


@torch.no_grad()
def drift_nll(model: nn.Module, tokenizer, texts: list[str], rows: int = 64) -> float:
    """The mean negative log-likelihood per predicted token of ``texts`` under ``model`` (each text's tokens as
    the tokenizer makes them, every token after the first predicted from those before it, as ``transformers``'
    loss with ``labels=input_ids``; texts beyond the model's context are cut there, with a warning), over
    at most ``rows`` texts per forward."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    encoded = [tokenizer(text).input_ids for text in texts]
    long = sum(len(ids) > context for ids in encoded) if context else 0
    if long:
        # stacklevel 1: the caller's frame is torch.no_grad's wrapper, which would label the warning torch's
        warnings.warn(f"{long} drift text(s) exceed the model's context of {context} tokens: each is cut there",
                      stacklevel=1)
        encoded = [ids[:context] for ids in encoded]
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # texts of like length batch together
    start = 0
    while start < len(order):
        longest = len(encoded[order[min(len(order), start + rows) - 1]])
        size = min(rows, rows_per_forward(model, longest))
        batch = [encoded[i] for i in order[start:start + size]]
        part, counted = _nll_sum(model, batch, tokenizer.pad_token_id or 0, device)
        total, count, start = total + part, count + counted, start + size
    if count == 0:
        raise ValueError("the drift texts have no token to predict (each is one token or none)")
    return float(total / count)


def _nll_sum(model: nn.Module, batch: list[list[int]], pad: int, device) -> tuple[torch.Tensor, int]:
    """The summed negative log-likelihood of the batch's predicted tokens (right-padded), and their count."""
    width = max(len(ids) for ids in batch)
    ids = torch.tensor([x + [pad] * (width - len(x)) for x in batch], device=device)
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in batch], device=device)
    options = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    logits = model(input_ids=ids, attention_mask=mask, **options).logits[:, :-1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    counted = mask[:, 1:].to(nll.dtype)
    return (nll * counted).sum().double(), int(mask[:, 1:].sum())


def pass_at_k(correct: list[list[bool]], k: int) -> float:
    """The mean over prompts of the unbiased pass@k of each prompt's ``n >= k`` samples (``c`` of them correct):
    ``1 - C(n - c, k) / C(n, k)``."""
    if not correct or any(len(row) < k for row in correct) or k < 1:
        raise ValueError(f"pass@{k} needs at least {k} samples of every prompt")
    scores = []
    for row in correct:
        n, c = len(row), sum(row)
        scores.append(1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k))
    return sum(scores) / len(scores)


__all__ = ["LOGITS_BYTES", "drift_nll", "kl_sums", "pass_at_k", "read_texts", "rows_per_forward"]
