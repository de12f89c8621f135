"""generate() under pm.perturbing(): rows laid out members x prompts (pm.member_rows), the KV cache and
left-padded prompts of different lengths; each row generates what its member's own model generates."""

import pytest
import torch

import nesgpu

tf = pytest.importorskip("transformers")
from test_hf import SIGMA, VOCAB, make, member  # noqa: E402  (tests/layers is on sys.path)

PAD = 0


def prompts():
    lengths = [5, 2, 4]
    ids = torch.full((3, 5), PAD)
    for i, n in enumerate(lengths):  # left padding
        ids[i, 5 - n :] = torch.randint(3, 60, (n,), generator=torch.Generator().manual_seed(i))
    return ids, (ids != PAD).long()


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3_moe"])
def test_greedy_generation_of_every_member_with_left_padding(family):
    net = nesgpu.convert(make(family), "lowrank")
    pm = nesgpu.PerturbedModel(net, 3, sigma=SIGMA, antithetic=True, seed=5)
    pm.set_noise()
    ids, mask = prompts()
    with pm.perturbing():
        out = net.generate(input_ids=pm.member_rows(ids), attention_mask=pm.member_rows(mask), max_new_tokens=6,
                           min_new_tokens=6, do_sample=False, pad_token_id=PAD)
    answers = pm.by_member(out[:, ids.shape[1]:])  # (signs, prompts, directions, tokens)
    assert answers.shape == (2, 3, 3, 6)
    for row in range(out.shape[0]):
        sign, prompt, d = row // 9, (row // 3) % 3, row % 3
        own = member(net, pm, d + 3 * sign)
        ref = own.generate(input_ids=ids[prompt : prompt + 1], attention_mask=mask[prompt : prompt + 1],
                           max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=PAD)
        assert torch.equal(ref[0, ids.shape[1]:], answers[sign, prompt, d]), row


def test_sampling_draws_each_row_from_its_own_members_distribution():
    net = nesgpu.convert(make("llama"), "lowrank")
    pm = nesgpu.PerturbedModel(net, 4, sigma=SIGMA, antithetic=True, seed=6)
    pm.set_noise()
    ids, mask = prompts()
    rows, row_mask = pm.member_rows(ids), pm.member_rows(mask)
    torch.manual_seed(0)
    with pm.perturbing():
        out = net.generate(input_ids=rows, attention_mask=row_mask, max_new_tokens=5, min_new_tokens=5,
                           do_sample=True, top_k=0, temperature=1.0, pad_token_id=PAD, return_dict_in_generate=True,
                           output_logits=True)
    logits = torch.stack(out.logits, 1)  # (rows, steps, vocab): the distribution each token was drawn from
    new = out.sequences[:, ids.shape[1]:]
    assert len({tuple(r.tolist()) for r in new}) > new.shape[0] // 2  # rows draw independently
    full_mask = torch.cat([row_mask, torch.ones_like(new)], 1)
    for row in range(rows.shape[0]):
        own = member(net, pm, row % 4 + 4 * (row // 12))
        ref = own(input_ids=out.sequences[row : row + 1], attention_mask=full_mask[row : row + 1]).logits[0]
        torch.testing.assert_close(logits[row], ref[ids.shape[1] - 1 : -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("option", [{"num_beams": 2}, {"num_beams": 2, "num_return_sequences": 2}])
def test_generate_options_that_repeat_the_rows_are_refused_in_a_population_call(option):
    net = nesgpu.convert(make("llama"), "lowrank")
    pm = nesgpu.PerturbedModel(net, 2, sigma=SIGMA, antithetic=True)
    pm.set_noise()
    rows = pm.member_rows(torch.randint(3, VOCAB, (1, 5)))
    refused = r"generate\(num_beams=2\) in a population call: transformers repeats each row"
    with pytest.raises(ValueError, match=refused), pm.perturbing():
        net.generate(input_ids=rows, max_new_tokens=2, do_sample=False, pad_token_id=0, **option)
    assert "generate" not in net.__dict__  # the guard ends with the block
    net.generate(input_ids=rows[:1], max_new_tokens=2, do_sample=False, pad_token_id=0, **option)  # plain: as ever
