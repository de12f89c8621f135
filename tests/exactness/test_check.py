"""nesgpu.check proves exactness on the user's model, and catches what is not: it passes models that are
exact, fails an injected layout bug, reports the fallback a direct read takes, refuses what it cannot make exact,
and the CLI exits accordingly."""

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

import nesgpu
from nesgpu.layers import PerturbedLinear


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


class Reader(nn.Module):
    """A parent that computes with its child's weight instead of calling the child."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)

    def forward(self, x):
        return self.b(torch.tanh(x @ self.a.weight.t()))


class Interleaved(PerturbedLinear):
    """An injected bug: the layer sees its input's tokens reordered (t, row) before its product, so rows
    reach the wrong directions."""

    def population_forward(self, x):
        rows, tokens = x.shape[0], x.shape[1]
        y = super().population_forward(x.transpose(0, 1).reshape(rows, tokens, -1))
        return y.reshape(tokens, rows, -1).transpose(0, 1)


def test_an_exact_model_passes_and_the_report_names_every_module():
    report = nesgpu.check(mlp(), torch.randn(3, 4))
    assert report.exact and report.worst < 1e-12 and not report.fallback and report.refused is None
    assert {m.name for m in report.modules} == {"", "0", "1", "2"}
    assert str(report).startswith("exact:")


def test_the_model_passed_in_is_not_changed():
    model = mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    nesgpu.check(model, torch.randn(3, 4))
    assert type(model[0]) is nn.Linear and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_an_injected_layout_bug_is_a_difference_named_at_its_module():
    model = nesgpu.convert(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), "lowrank")
    model[2].__class__ = Interleaved
    report = nesgpu.check(model, torch.randn(3, 5, 4))
    assert not report.exact and report.worst > 1e-3
    assert report.first_difference.name == "2"
    assert "DIFFERENT" in str(report) and "first differing module: 2 (Interleaved)" in str(report)


def test_a_direct_read_takes_the_exact_fallback_named_in_the_report():
    report = nesgpu.check(Reader(), torch.randn(3, 4))
    assert report.exact and report.fallback == {"": "computes with its child's parameter 'a.weight' (t)"}
    assert report.fallback_share == 1.0 and "  model: computes with its child's parameter 'a.weight'" in str(report)
    named = nesgpu.check(Reader(), torch.randn(3, 4), fallback=[""])
    assert named.exact and named.fallback == {"": "is named in convert(..., fallback=[...])"}


def test_a_population_call_nesgpu_cannot_make_exact_is_refused():
    class Head(nn.Module):  # computes with its child's weight, which is tied to an embedding outside it
        def __init__(self):
            super().__init__()
            self.out = nn.Linear(4, 9)

        def forward(self, h):
            return self.out(h) * self.out.weight.mean()

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(9, 4), Head()
            self.head.out.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.embed(ids))

    report = nesgpu.check(Tied(), torch.randint(0, 9, (3, 5)))
    assert not report.exact and report.refused.startswith("population call: parameter 'head.out.weight'")


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(TypeError, match="example_inputs must be a tensor, a tuple of arguments or a dict"):
        nesgpu.check(mlp(), 3)
    with pytest.raises(ValueError, match="directions must be a positive int; got 0"):
        nesgpu.check(mlp(), torch.randn(3, 4), directions=0)
    with pytest.raises(ValueError, match="sigma must be a finite number >= 1e-12"):
        nesgpu.check(mlp(), torch.randn(3, 4), sigma=float("inf"))
    refused = nesgpu.check(mlp(), torch.randn(3, 4), fallback=["nope"])
    assert not refused.exact and "fallback: 'nope' names no module of the model" in refused.refused


def test_the_cli_exits_0_when_exact_1_when_refused_and_2_for_a_bad_argument(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text("import torch\nfrom torch import nn\n\n\nclass Reader(nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n"
                      "        self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)\n\n"
                      "    def forward(self, x):\n        return self.b(torch.tanh(x @ self.a.weight.t()))\n\n\n"
                      "def exact():\n    return nn.Sequential(nn.Linear(4, 3), nn.Tanh()), torch.randn(2, 4)\n\n\n"
                      "def reader():\n    return Reader(), torch.randn(2, 4)\n")

    def check(*args):
        return subprocess.run([sys.executable, "-m", "nesgpu", "check", *args], capture_output=True, text=True,
                              timeout=120)

    ok = check("--model", f"{source}:exact")
    assert ok.returncode == 0 and ok.stdout.startswith("exact:"), ok.stderr
    fell_back = check("--model", f"{source}:reader")
    assert fell_back.returncode == 0 and "  model: computes with its child's parameter 'a.weight'" in fell_back.stdout
    assert "Traceback" not in fell_back.stderr
    assert check("--model", f"{source}:reader", "--fallback", "").returncode == 0
    bad = check("--model", f"{source}:missing")
    assert bad.returncode == 2 and "has no function 'missing'" in bad.stderr and "Traceback" not in bad.stderr
    assert check("--model", "hf:/no/such/dir").returncode == 2


def test_sampled_generate_is_compared_by_its_logits_and_a_difference_is_found():
    tf = pytest.importorskip("transformers")
    from nesgpu.exactness.generation import compare_generate
    from nesgpu.exactness.rows import Inputs

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, pad_token_id=0, eos_token_id=2)
    model = tf.LlamaForCausalLM(config).double().eval()
    ids = {"input_ids": torch.randint(3, 40, (2, 5)), "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    report = nesgpu.check(model, ids, directions=2, max_new_tokens=3)
    assert report.exact and "3 greedy tokens, and 3 sampled" in report.generate, str(report)

    pm = nesgpu.PerturbedModel(nesgpu.convert(copy.deepcopy(model), "lowrank"), 2, sigma=0.05, antithetic=True)
    pm.set_noise(step=1)
    inputs = Inputs.of(ids)
    scaled = copy.deepcopy(model)  # logits 1% larger: the same greedy tokens, another sampling distribution
    with torch.no_grad():
        scaled.lm_head.weight.mul_(1.01)
    found = compare_generate(scaled, pm, inputs, inputs.member_rows(pm), 3, [], 1e-9)
    assert found.startswith("differs: sampled"), found
