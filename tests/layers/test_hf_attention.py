"""Attention sinks (a vector of the attention module's own, beside its projections): batched where the module's
attention views it over the batch, exact either way; any other use of its values sends the module to the exact
fallback, by name."""

import pytest
import torch
from torch import nn

import nesgpu


class SinkAttention(nn.Module):
    """A single-head attention with a sink logit per head, as transformers' GPT-OSS eager attention uses it:
    ``sinks.reshape(1, -1, 1, 1).expand(batch, -1, queries, -1)`` as one more softmax column."""

    def __init__(self, heads=2, dim=8, broadcast=True):
        super().__init__()
        self.heads, self.broadcast = heads, broadcast
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.sinks = nn.Parameter(torch.randn(heads))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        logits = q @ k.transpose(2, 3)
        if self.broadcast:
            sinks = self.sinks.reshape(1, -1, 1, 1).expand(b, -1, t, -1)
        else:  # a use nesgpu does not compute per member
            sinks = (self.sinks * torch.ones(b, t, 1, 1)).permute(0, 3, 1, 2)
        probs = torch.softmax(torch.cat([logits, sinks], dim=-1), dim=-1)[..., :-1]
        return (probs @ v).transpose(1, 2).reshape(b, t, -1)


class Net(nn.Module):
    def __init__(self, broadcast=True):
        super().__init__()
        torch.manual_seed(0)
        self.self_attn, self.head = SinkAttention(broadcast=broadcast), nn.Linear(8, 3)

    def forward(self, inputs_embeds):  # named as transformers names it: the rows are certainly first
        return self.head(self.self_attn(inputs_embeds))


def embeds(samples=3):
    return {"inputs_embeds": torch.randn(samples, 5, 8)}


def test_sinks_viewed_over_the_batch_are_batched_and_exact():
    report = nesgpu.check(Net(), embeds())
    assert report.exact and not report.fallback, str(report)
    net = nesgpu.convert(Net(), "lowrank")
    assert type(net.self_attn).__name__ == "PerturbedSinkAttention"
    assert type(net.self_attn.q_proj).__name__ == "PerturbedLinear"  # its projections are converted on their own
    assert [s.name for s in net.self_attn.slots] == ["sinks"]


def test_any_other_use_of_the_sinks_takes_the_exact_fallback_by_name():
    report = nesgpu.check(Net(broadcast=False), embeds())
    assert report.exact, str(report)
    assert report.fallback == {"self_attn": "uses its 'sinks' by mul"}


def test_where_the_rows_may_not_come_first_the_sinks_take_the_exact_fallback():
    report = nesgpu.check(Net(), torch.randn(3, 5, 8))  # a bare tensor: a sequence-first model is possible
    assert report.exact and report.fallback == {"self_attn": "uses its 'sinks' by reshape"}, str(report)


def test_frozen_sinks_stay_the_models_own():
    report = nesgpu.check(Net(), embeds(2), freeze=["self_attn.sinks"])
    assert report.exact and not report.fallback, str(report)


def test_a_direct_call_without_the_population_rows_is_an_error():
    pm = nesgpu.PerturbedModel(nesgpu.convert(Net(), "lowrank"), 2, sigma=0.1)
    pm.set_noise()
    with pytest.raises(ValueError, match="self_attn"):
        with pm.perturbing():
            pm.model.self_attn(torch.randn(8, 5, 8))
