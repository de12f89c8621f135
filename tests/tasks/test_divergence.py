"""How far a language model moved from its start: kl against a float64 reference token by token, drift_nll against
transformers' own loss, pass@k against its formula, and the drift text files as a user writes them."""

import copy
import json
import math

import pytest
import torch
from conftest import char_tokenizer
from test_generation import tiny_llama

from nesgpu.cli import warning_source
from nesgpu.tasks.divergence import drift_nll, kl_sums, pass_at_k, read_texts
from nesgpu.tasks.likelihood import joined
from nesgpu.train.steps.anchor import StartingWeights

PROMPTS = ["1+2=", "12+3=", "7*7="]


def moved(model, seed=1, size=0.05):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(size * torch.randn_like(p))


def completions(tokenizer, model):
    ids, mask = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left").values()
    torch.manual_seed(2)
    new = torch.randint(3, model.config.vocab_size, (len(PROMPTS), 4))
    kept = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    return ids, mask, new, kept


def reference_kl(current, start, tokenizer, new, kept, temperature):
    """Each row alone (no padding), float64: mean over kept tokens of exp(r) - r - 1, r = log p_start - log p."""
    terms = []
    for prompt, row, keep in zip(PROMPTS, new, kept):
        tokens = torch.tensor([tokenizer(prompt).input_ids + row[keep].tolist()])
        first = len(tokenizer(prompt).input_ids)
        logp = [torch.log_softmax(m(input_ids=tokens).logits[0].double() / temperature, -1) for m in (current, start)]
        for j in range(int(keep.sum())):
            token = tokens[0, first + j]
            r = logp[1][first + j - 1, token] - logp[0][first + j - 1, token]
            terms.append(torch.exp(r) - r - 1)
    return torch.stack(terms).mean()


def test_kl_matches_a_float64_reference_token_by_token_and_is_zero_at_the_start():
    tokenizer, model = char_tokenizer(), tiny_llama().double()
    start = StartingWeights(model, list(model.parameters()))
    ids, mask, new, kept = completions(tokenizer, model)
    joint = joined(ids, mask, new, kept, tokenizer.pad_token_id)
    total, count = kl_sums(model, start, *joint, kept, 0.7)
    assert float(total) == 0.0 and int(count) == int(kept.sum())  # the model is its start: exactly zero
    initial = copy.deepcopy(model)
    moved(model)
    after = [p.detach().clone() for p in model.parameters()]
    total, count = kl_sums(model, start, *joint, kept, 0.7)
    want = reference_kl(model, initial, tokenizer, new, kept, 0.7)
    assert float(total / count) > 0
    torch.testing.assert_close(total / count, want, rtol=1e-10, atol=0)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), after))  # the model is back as it was


def test_kl_and_drift_batch_their_rows_below_the_logits_budget(monkeypatch):
    from nesgpu.tasks import divergence

    tokenizer, model = char_tokenizer(), tiny_llama().double()
    start = StartingWeights(model, list(model.parameters()))
    moved(model)
    ids, mask, new, kept = completions(tokenizer, model)
    joint = joined(ids, mask, new, kept, tokenizer.pad_token_id)
    whole, drift = kl_sums(model, start, *joint, kept, 1.0), drift_nll(model, tokenizer, PROMPTS)
    one_row = 3 * 4 * model.config.vocab_size * (kept.shape[1] + 1)
    monkeypatch.setattr(divergence, "LOGITS_BYTES", one_row)  # one row per forward
    assert divergence.rows_per_forward(model, kept.shape[1] + 1) == 1
    torch.testing.assert_close(kl_sums(model, start, *joint, kept, 1.0), whole, rtol=1e-12, atol=0)
    assert drift_nll(model, tokenizer, PROMPTS) == pytest.approx(drift, rel=1e-12)


def test_drift_nll_is_transformers_loss_over_every_predicted_token():
    tokenizer, model = char_tokenizer(), tiny_llama().double()
    texts = ["1+2=3", "12+34=46 (7)", "7", "99-9=90"]  # "7": one token, nothing to predict
    with torch.no_grad():
        losses = [(model(input_ids=ids, labels=ids).loss * (ids.shape[1] - 1), ids.shape[1] - 1)
                  for ids in (torch.tensor([tokenizer(t).input_ids]) for t in texts if len(t) > 1)]
        exact = [-torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).sum()
                 for ids in (torch.tensor([tokenizer(t).input_ids]) for t in texts if len(t) > 1)]
    want = sum(loss for loss, _ in losses) / sum(n for _, n in losses)
    for rows in (1, 2, 64):  # batched or not, padded or not
        value = drift_nll(model, tokenizer, texts, rows)
        assert value == pytest.approx(float(want), rel=1e-6)  # transformers takes the loss in float32
        assert value == pytest.approx(float(sum(exact) / sum(n for _, n in losses)), rel=1e-12)


def test_a_drift_text_beyond_the_context_is_cut_there_with_a_warning():
    tokenizer, model = char_tokenizer(), tiny_llama(context=8).double()
    with pytest.warns(UserWarning, match="1 drift text.s. exceed the model's context of 8 tokens") as seen:
        value = drift_nll(model, tokenizer, ["1234567890123", "12"])
    assert value == pytest.approx(drift_nll(model, tokenizer, ["12345678", "12"]), rel=1e-12)
    # the console labels it nesgpu's, not torch's (whose no_grad wrapper is drift_nll's caller; issue 55)
    assert [warning_source(w.filename) for w in seen] == ["nesgpu"]


def test_drift_text_files_plain_or_json_lines_and_their_mistakes_named(tmp_path):
    plain = tmp_path / "wiki.txt"
    plain.write_text("first line\n\nsecond line\n")
    assert read_texts(plain) == ["first line", "second line"]
    rows = tmp_path / "wiki.jsonl"
    rows.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": "b", "id": 2}) + "\n")
    assert read_texts(rows) == ["a", "b"]
    rows.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"body": "b"}) + "\n")
    with pytest.raises(ValueError, match="wiki.jsonl, line 2: expected an object with a non-empty 'text'"):
        read_texts(rows)
    rows.write_text("{not json\n")
    with pytest.raises(ValueError, match="line 1: not JSON"):
        read_texts(rows)
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="empty.txt: no texts"):
        read_texts(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="not a regular file"):
        read_texts(tmp_path)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k([[True, False, False]], 1) == pytest.approx(1 / 3)
    assert pass_at_k([[True, False, False]], 3) == 1.0
    assert pass_at_k([[True, True, False, False, False]], 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k([[False] * 4, [True] * 4], 2) == 0.5
    with pytest.raises(ValueError, match="pass@3 needs at least 3 samples"):
        pass_at_k([[True, False]], 3)
