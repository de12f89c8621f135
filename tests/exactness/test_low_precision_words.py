"""nesgpu.check's report of the parts a model computes below the check's precision: in a user's words (which
module of theirs, which operations, which dtype, what it means), not torch's operation names."""

import torch
from torch import nn

import nesgpu


class Norm(nn.Module):
    """An RMSNorm that upcasts, as transformers' do."""

    def __init__(self, n, dtype=torch.float32):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.compute = dtype

    def forward(self, x):
        h = x.to(self.compute)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Net(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(6, 8), Norm(8, dtype), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.softmax(self.norm(self.fc1(x)), -1, dtype=torch.float32).to(x.dtype))


def test_float32_parts_are_named_by_module_operation_and_dtype():
    torch.manual_seed(0)
    report = nesgpu.check(Net(), torch.randn(4, 6), directions=2)
    assert report.exact and report.tolerance == 1e-5
    assert set(report.low_precision) == {
        "norm (Norm): a cast (.float() / .to()), pow, mean, add, rsqrt, mul in float32",
        "the model (Net): a cast (.float() / .to()), softmax in float32"}
    line = str(report).splitlines()[1]
    assert line.startswith("your model's own code computes some parts below the check's precision: ")
    assert "not nesgpu's" in line and "tolerance 1e-05" in line and "not a wrong population row" in line
    assert "(an operation)" not in str(report) and "_to_copy" not in str(report)


def test_half_parts_of_a_float32_check_say_their_dtype():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), Norm(8, torch.bfloat16), nn.Linear(8, 3))
    report = nesgpu.check(model, torch.randn(4, 6), directions=2, dtype=torch.float32)
    assert report.low_precision == ("1 (Norm): a cast (.float() / .to()), pow, mean, add, rsqrt, mul in bfloat16",)


def test_a_model_in_the_checks_precision_has_no_such_line():
    torch.manual_seed(0)
    report = nesgpu.check(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)), torch.randn(4, 6), directions=2)
    assert report.exact and report.low_precision == () and report.tolerance == 1e-9
    assert "below the check's precision" not in str(report)
