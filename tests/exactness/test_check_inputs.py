"""nesgpu.check refuses what would prove nothing or cannot be run (issue 55): an empty batch (it returned a report
of 0 rows) and a max_new_tokens that is not a whole number >= 0 (a negative one, a float, a string), each in one
ValueError or TypeError naming what was expected; from the CLI, one line."""

import subprocess
import sys

import pytest
import torch
from torch import nn

import nesgpu


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


@pytest.mark.parametrize("inputs", [torch.zeros(0, 4), (torch.zeros(0, 4),), {"input": torch.zeros(0, 4)}])
def test_an_empty_batch_is_refused(inputs):
    with pytest.raises(ValueError, match="example_inputs holds 0 samples .*expected a batch of at least one sample"):
        nesgpu.check(mlp(), inputs)


@pytest.mark.parametrize("tokens, error, got", [(-1, ValueError, "got -1"), (2.5, TypeError, "got float 2.5"),
                                                ("4", TypeError, "got str '4'"), (True, TypeError, "got bool True"),
                                                (1 << 40, ValueError, f"got {1 << 40}")])
def test_a_max_new_tokens_that_is_not_a_whole_number_at_least_0_is_refused(tokens, error, got):
    with pytest.raises(error, match=f"max_new_tokens must be a whole number .*; {got}"):
        nesgpu.check(mlp(), torch.randn(2, 4), max_new_tokens=tokens)
    assert nesgpu.check(mlp(), torch.randn(2, 4), max_new_tokens=0).exact  # 0: the forward pass only


def test_the_cli_refuses_an_empty_batch_in_one_line(tmp_path):
    (tmp_path / "empty.py").write_text("import torch\nfrom torch import nn\n\n\n"
                                       "def empty():\n    return nn.Linear(4, 2), torch.zeros(0, 4)\n")
    done = subprocess.run([sys.executable, "-m", "nesgpu", "check", "--model", f"{tmp_path / 'empty.py'}:empty"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.strip().splitlines() == ["nesgpu check: error: example_inputs holds 0 samples (its tensors' "
                                                "first dimension); expected a batch of at least one sample"]
