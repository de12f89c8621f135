"""A zoo of whole models: after convert, every trainable parameter receives an ES gradient, and the
population output of row n depends only on direction n % D (and the rows of its own member)."""

import warnings

import pytest
import torch
from torch import nn

import nesgpu


class BareParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.temperature = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.fc(x) / self.temperature


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 8)
        self.layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 7)

    def forward(self, tokens):
        x = self.embed(tokens)
        return self.head(self.layer(x, x, tgt_mask=nn.Transformer.generate_square_subsequent_mask(x.shape[1]),
                                    tgt_is_causal=True))


class Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(4, 6, batch_first=True)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


ZOO = {
    "mlp": (lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), lambda n: torch.randn(n, 4)),
    "cnn": (lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)),
            lambda n: torch.randn(n, 1, 6, 6)),
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(1, 4, 5), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 12, 3)),
               lambda n: torch.randn(n, 1, 16)),
    "encoder": (lambda: nn.Sequential(nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
                                                            num_layers=2, enable_nested_tensor=False)),
                lambda n: torch.randn(5, n, 8)),
    "decoder": (Decoder, lambda n: torch.randint(0, 7, (n, 5))),
    "gru": (lambda: Recurrent(nn.GRU), lambda n: torch.randn(n, 5, 4)),
    "lstm": (lambda: Recurrent(nn.LSTM), lambda n: torch.randn(n, 5, 4)),
    "bare-parameter": (BareParameter, lambda n: torch.randn(n, 4)),
    "batchnorm": (lambda: nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)),
                  lambda n: torch.randn(n, 4)),
}


@pytest.mark.parametrize("kind", ["lowrank", "gaussian"])
@pytest.mark.parametrize("name", list(ZOO))
def test_every_parameter_gets_a_gradient_and_rows_stay_apart(name, kind):
    factory, make_input = ZOO[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bare parameter's fallback warns that it is slow
        model = nesgpu.convert(factory(), kind)
    directions, repeats = 4, 4
    pm = nesgpu.PerturbedModel(model, directions, sigma=0.1, antithetic=True, seed=1)
    pm.set_noise()
    rows = repeats * directions
    x = make_input(rows)
    row_dim = 1 if name == "encoder" else 0  # the encoder is sequence-first
    out = pm(x)
    # member (+, d=1) owns rows 1 and 5: changing every other row leaves its outputs as they were
    member = torch.tensor([1, 5])
    others = torch.tensor([n for n in range(rows) if n not in (1, 5)])
    x2 = x.clone()
    x2.index_copy_(row_dim, others, make_input(rows).index_select(row_dim, others))
    torch.testing.assert_close(pm(x2).index_select(row_dim, member), out.index_select(row_dim, member),
                               rtol=1e-6, atol=1e-6)
    # and its outputs depend on its direction: another step's noise changes them
    pm.set_noise()
    assert not torch.allclose(pm(x).index_select(row_dim, member), out.index_select(row_dim, member))
    pm.update(torch.randn(repeats, directions))
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n
