"""nesgpu.check proves exactness on the user's model, and catches what is not: it passes models that are
exact, fails an injected layout bug, reports the fallback a direct read takes, refuses what it cannot make exact,
and the CLI exits accordingly."""

import copy
import os
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
    with pytest.raises(ValueError, match=r"sigma must be a number in \[1e-12, 1e\+18\]"):
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
                              timeout=600)

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


def test_a_model_with_non_finite_weights_or_buffers_is_refused_naming_them():
    model = mlp()
    with torch.no_grad():
        model[2].bias[0] = float("nan")
    report = nesgpu.check(model, torch.randn(3, 4))
    assert not report.exact and report.refused.startswith("the model holds NaN or infinity in ['2.bias']: ")
    assert str(report).startswith("refused: the model holds NaN or infinity")
    normed = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    normed[1].running_var.fill_(float("inf"))
    report = nesgpu.check(normed, torch.randn(3, 4))
    assert not report.exact and "['1.running_var']" in report.refused


@pytest.mark.parametrize("tolerance", [float("nan"), -1, -1e-12, float("inf")])
def test_a_tolerance_that_is_no_finite_number_at_or_above_0_is_refused(tolerance):
    with pytest.raises(ValueError, match=rf"tolerance must be a finite number >= 0; got {tolerance!r}"):
        nesgpu.check(mlp(), torch.randn(3, 4), tolerance=tolerance)


def test_a_tolerance_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="tolerance must be a finite number >= 0; got str '1e-9'"):
        nesgpu.check(mlp(), torch.randn(3, 4), tolerance="1e-9")
    assert nesgpu.check(mlp(), torch.randn(3, 4), tolerance=0).tolerance == 0  # 0 is a tolerance: none


def _check_cli(*args):
    return subprocess.run([sys.executable, "-m", "nesgpu", "check", *args], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.parametrize("tolerance", ["nan", "-1", "inf"])
def test_the_cli_refuses_a_bad_tolerance_in_one_line_before_the_model_loads(tmp_path, tolerance):
    source = tmp_path / "mine.py"
    source.write_text(f"raise SystemExit('loaded {source}')\n")  # the model's file must not even run
    result = _check_cli("--model", f"{source}:build", f"--tolerance={tolerance}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0] == f"nesgpu check: error: --tolerance must be a finite number >= 0; got {float(tolerance)}"


def _tiny_llama(directory, vocab=None, nan=False):
    tf = pytest.importorskip("transformers")
    from conftest import char_tokenizer

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=vocab or len(char_tokenizer()), hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=1))
    if nan:
        with torch.no_grad():
            model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


def test_the_cli_refuses_an_hf_model_with_a_nan_weight_and_exits_1(tmp_path):
    hf = _tiny_llama(tmp_path / "m", nan=True)
    result = _check_cli("--model", f"hf:{hf}", "--directions", "1")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stdout.startswith("refused: the model holds NaN or infinity in "
                                    "['model.layers.0.mlp.up_proj.weight']"), result.stdout


def test_the_cli_refuses_a_tokenizer_larger_than_the_embedding_in_trainings_words(tmp_path):
    from conftest import char_tokenizer

    tokens = len(char_tokenizer())
    hf = _tiny_llama(tmp_path / "m", vocab=tokens - 1)
    result = _check_cli("--model", f"hf:{hf}", "--directions", "1")
    lines = [line for line in result.stderr.splitlines() if "error" in line]  # not transformers' progress bars
    assert result.returncode != 0 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0] == (f"nesgpu check: error: the tokenizer in {hf} has {tokens} tokens, but the model's embedding "
                        f"has {tokens - 1} rows; use the tokenizer the model was trained with")
    assert not result.stdout.startswith("exact")
