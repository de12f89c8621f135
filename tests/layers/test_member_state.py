"""A state object handed to the exact fallback (a cache) is split member by member and merged back: tensors a
member replaces are concatenated, tensors updated in place write through, shared values stay shared."""

import torch
from torch import nn

import nesgpu
from nesgpu.layers.member_state import holds_state, member_view, merge_members


class Layer:
    def __init__(self):
        self.keys = None  # filled at the first call, as transformers' DynamicLayer does
        self.total = torch.zeros(1)  # not per row: shared


class Cache:
    def __init__(self, rows):
        self.layers = [Layer()]
        self.running = torch.zeros(rows, 3)  # per row, updated in place
        self.calls = 0


def test_a_member_view_holds_its_row_and_the_merge_puts_every_row_back():
    cache = Cache(4)
    views = [member_view(cache, i, 4) for i in range(4)]
    for i, view in enumerate(views):
        view.layers[0].keys = torch.full((1, 2), float(i))  # replaced
        view.running += i  # in place, through the view
        view.calls += 1
    merge_members(cache, views, 4)
    assert torch.equal(cache.layers[0].keys, torch.arange(4.0).repeat_interleave(2).view(4, 2))
    assert torch.equal(cache.running, torch.arange(4.0).view(4, 1).expand(4, 3))
    assert cache.calls == 1 and cache.layers[0].total.shape == (1,)
    assert holds_state(cache) and not holds_state(torch.zeros(2)) and not holds_state((torch.zeros(2),))


class Recurrent(nn.Module):
    """A module with its own parameter that keeps a per-row running state in a cache object."""

    def __init__(self):
        super().__init__()
        self.decay, self.lin = nn.Parameter(torch.full((3,), 0.5)), nn.Linear(3, 3)

    def forward(self, x, cache):
        layer = cache.layers[0]
        layer.keys = x if layer.keys is None else torch.cat([layer.keys, x], dim=1)
        cache.running.mul_(self.decay).add_(self.lin(x).sum(1))
        return layer.keys.sum(1, keepdim=True) + cache.running.unsqueeze(1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.rec = nn.Linear(3, 3), Recurrent()

    def forward(self, x):
        cache = Cache(x.shape[0])
        self.rec(self.inp(x), cache)
        return self.rec(self.inp(2 * x), cache)  # a second step sees the state the first left


def test_a_fallback_module_with_a_cache_is_exact_member_by_member():
    torch.manual_seed(0)
    report = nesgpu.check(Model(), torch.randn(3, 2, 3))
    assert report.exact and list(report.fallback) == ["rec"], str(report)
