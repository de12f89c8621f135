import re
from pathlib import Path

import pytest
import torch
from torch import nn

import nesgpu

# (layer class, options): every perturbation kind and its option space, for Linear ...
LINEAR_CASES = [
    (nesgpu.PerturbedLinear, {}),
    (nesgpu.SparsePerturbedLinear, {}),
    (nesgpu.SparsePerturbedLinear, {"k": 1}),
    (nesgpu.SparsePerturbedLinear, {"k": 0.5}),
    (nesgpu.PermutedLinear, {}),
    (nesgpu.PermutedLinear, {"permutation": "in"}),
    (nesgpu.PermutedLinear, {"permutation": "out"}),
    (nesgpu.PermutedLinear, {"permutation": "both"}),
    (nesgpu.PermutedLinear, {"in_sparsity": 0.5}),
    (nesgpu.PermutedLinear, {"out_sparsity": 2}),
    (nesgpu.PermutedLinear, {"permutation": "both", "in_sparsity": 3, "out_sparsity": 0.5}),
    (nesgpu.FlipoutLinear, {}),
    (nesgpu.FlipoutLinear, {"signs": "in"}),
    (nesgpu.FlipoutLinear, {"signs": "out"}),
    (nesgpu.LowRankLinear, {}),
    (nesgpu.LowRankLinear, {"rank": 3}),
]

# ... and for Conv2d
CONV_CASES = [
    (nesgpu.PerturbedConv2d, {}),
    (nesgpu.PermutedConv2d, {}),
    (nesgpu.PermutedConv2d, {"permutation": "in"}),
    (nesgpu.PermutedConv2d, {"permutation": "both"}),
    (nesgpu.PermutedConv2d, {"out_sparsity": 0.5}),
    (nesgpu.PermutedConv2d, {"in_sparsity": 0.5, "out_sparsity": 0.5}),
    (nesgpu.FlipoutConv2d, {}),
    (nesgpu.FlipoutConv2d, {"signs": "out"}),
    (nesgpu.LowRankConv2d, {}),
    (nesgpu.LowRankConv2d, {"rank": 2}),
]

# Conv2d geometries: (in, out, kernel, nn.Conv2d keyword arguments)
CONV_GEOMETRIES = [
    (4, 6, 3, {}),
    (4, 6, 3, {"stride": 2, "padding": 1, "bias": False}),
    (4, 6, (3, 2), {"dilation": 2, "padding": 2}),
    (4, 8, 3, {"groups": 2, "padding": 1}),
    (4, 6, 3, {"padding": 1, "padding_mode": "reflect"}),
    (4, 4, 1, {"groups": 4, "padding_mode": "circular", "padding": 1}),
]


# a character tokenizer for the language-model tests, built locally with `tokenizers` (no hub)
CHARS = list("0123456789+-*/()=>: \n")


class QuadraticTask:
    """A task for a float64 Linear(3, 2): each member's fitness is minus the squared distance of its output to 1."""

    metric, default_target, summed_info = "value", None, frozenset()

    def fitness(self, pm, step):
        rows = pm(torch.ones((2 if pm.antithetic else 1) * pm.local_directions, 3, dtype=torch.float64))
        return -(rows - 1.0).pow(2).sum(-1).view(-1, pm.local_directions), {}

    def finish_step(self, pm, info):
        pass

    def evaluate(self, model):
        return 0.0


def char_tokenizer(pad=True):
    import tokenizers
    import transformers

    vocab = {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="[EOS]", unk_token="[UNK]",
                                                **({"pad_token": "[PAD]"} if pad else {}))


# where the layer tests run: the CPU always, and CUDA when this machine has it (benchmarks/gpu_check.sh)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def needs_antithetic(cls, options=None) -> bool:
    """The permuted kind is biased without antithetic pairs, and PerturbedModel refuses that combination
    (tests/test_estimator.py shows both the refusal and the bias)."""
    return issubclass(cls, (nesgpu.PermutedLinear, nesgpu.PermutedConv2d))


def antithetic_or_skip(case, antithetic: bool) -> bool:
    """``antithetic`` for this case, skipping the combinations PerturbedModel refuses."""
    if needs_antithetic(*case) and not antithetic:
        pytest.skip("PerturbedModel refuses the permuted kind without antithetic sampling")
    return antithetic


def case_id(case):
    cls, options = case
    return cls.__name__ + "".join(f"-{k}={v}" for k, v in options.items())


ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def doc_section(title: str) -> tuple[list[str], list[str]]:
    """A worked example of docs/architecture.md (its section ``### title``): its ```python blocks (the code)
    and its ```py blocks (the registration and its use)."""
    section = ARCHITECTURE.read_text().split(f"### {title}\n")[1].split("\n### ")[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S), re.findall(r"```py\n(.*?)```", section, flags=re.S)


def randomize_(module: nn.Module, seed: int = 1) -> nn.Module:
    """Give every parameter non-trivial values (biases included) from a private generator."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


@pytest.fixture(autouse=True)
def _no_global_seed_dependence():
    # Tests must not rely on the global RNG; fix it anyway so failures reproduce.
    torch.manual_seed(1234)
