"""Sequence-to-sequence tasks generated offline (reverse or sort a string of digits), for a small transformer.

A sample is ``x_1 .. x_L SEP y_1 .. y_L`` with ``y = rule(x)``; the model reads it shifted by one token
(teacher forcing, causal attention) and is scored on the L positions that predict ``y``. One forward per
member per step: the whole population is (sign, sample, direction) rows of token ids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..model import PerturbedModel
from ..noise import derive_seed
from .spec import BatchOptions, TaskSpec, batch_maker

_BATCH_STREAM = 0x6261  # the same key as the supervised tasks' minibatch sampler
_TEST_STREAM = 0x7465  # the held-out set: fixed, whatever the run seed
RULES = ("reverse", "sort")


def apply_rule(rule: str, x: torch.Tensor) -> torch.Tensor:
    """The target of each digit string.

    Args:
        rule: "reverse" or "sort" (ascending).
        x: digits, shape (N, L).

    Returns:
        y: shape (N, L).
    """
    if rule == "reverse":
        return x.flip(-1)
    if rule == "sort":
        return x.sort(dim=-1).values
    raise ValueError(f"unknown rule {rule!r}; expected one of {list(RULES)}")


class SequenceTransformer(nn.Module):
    """A decoder-only transformer from torch modules: token and position embeddings, pre-norm encoder layers
    under a causal mask, a final LayerNorm and a linear head.

    Args:
        vocab: number of token ids.
        max_len: longest input sequence.
        d_model, n_layers, n_heads, dim_feedforward: the usual sizes (d_model divisible by n_heads).

    Shape:
        tokens (N, T) long, T <= max_len -> logits (N, T, vocab). Rows stay on dim 0 throughout (positions
        are looked up as an (N, T) tensor), so a population of N = R * D rows runs as one batch.
    """

    def __init__(self, vocab: int, max_len: int, d_model: int = 32, n_layers: int = 2, n_heads: int = 2,
                 dim_feedforward: int | None = None):
        super().__init__()
        if d_model < 1 or n_layers < 1 or n_heads < 1 or d_model % n_heads:
            raise ValueError(f"expected d_model >= 1 divisible by n_heads >= 1 and n_layers >= 1; got "
                             f"d_model={d_model}, n_heads={n_heads}, n_layers={n_layers}")
        dim_feedforward = dim_feedforward or 2 * d_model
        self.max_len = max_len
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or not 1 <= tokens.shape[1] <= self.max_len:
            raise ValueError(f"expected token ids of shape (N, T) with 1 <= T <= {self.max_len}; got "
                             f"{tuple(tokens.shape)}")
        n, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).expand(n, t)
        h = self.tokens(tokens) + self.positions(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device, dtype=h.dtype)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


class SequenceTask:
    """Fitness = minus the mean cross-entropy over the target positions; metric = test token accuracy.

    Sequences: L digits in [0, digits), a separator (token id ``digits``), then the L target digits. The
    model input is the sequence without its last token (length 2L), and positions L .. 2L-1 predict the
    targets. Every direction (and both signs) sees the same minibatch, laid out (sign, sample, direction,
    T), so the fitness has shape (R = signs, D). The minibatch of step t comes from a generator seeded by
    (seed, t), so a resumed run sees the same data; training strings are uniform over all strings but the
    held-out test strings.

    Token accuracy is teacher-forced (each target position given the true prefix). Sequence accuracy (all
    L targets right) equals exact match under greedy decoding: if every teacher-forced prediction is
    right, greedy decoding reproduces the true prefix at every step, and conversely.

    Args:
        rule: "reverse" or "sort".
        length: digits per string (L >= 1).
        digits: vocabulary of the strings (>= 2); the model's vocabulary is ``digits + 1``.
        batch_size: strings per member per step.
        test_size: held-out strings (fixed: drawn from a constant seed, independent of ``seed``).
        device: where the population runs.
        seed: the run seed.
    """

    metric = "test_accuracy"  # token accuracy; the trainer's metrics.csv has this column
    default_target = None
    summed_info: frozenset[str] = frozenset()

    def __init__(self, rule: str = "reverse", length: int = 6, digits: int = 8, batch_size: int = 32,
                 test_size: int = 1000, device: torch.device | str = "cpu", seed: int = 0, name: str | None = None):
        if rule not in RULES:
            raise ValueError(f"unknown rule {rule!r}; expected one of {list(RULES)}")
        if length < 1:
            raise ValueError(f"length must be >= 1; got {length}")
        if digits < 2:
            raise ValueError(f"digits must be >= 2; got {digits}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if not 1 <= test_size <= digits ** length // 2:
            raise ValueError(f"test_size must be in [1, {digits ** length // 2}] (half of the {digits}^{length} "
                             f"strings); got {test_size}")
        self.rule, self.length, self.digits = rule, length, digits
        self.batch_size, self.seed, self.name = batch_size, seed, name or rule
        self.device = torch.device(device)
        self.vocab = digits + 1
        self.sep = digits
        gen = torch.Generator(device=self.device).manual_seed(derive_seed(0, 0, _TEST_STREAM))
        x_test = self._unique_strings(test_size, gen)
        test_codes = self._codes(x_test).sort().values
        self._test_shifted = test_codes - torch.arange(test_size, device=self.device)  # t_i - i: see batch()
        self.x_test, self.y_test = self.inputs(x_test), apply_rule(rule, x_test)

    # ----- data --------------------------------------------------------------------------------------
    def _codes(self, x: torch.Tensor) -> torch.Tensor:
        """Each string as one integer (base ``digits``): shape (N,)."""
        weights = self.digits ** torch.arange(self.length - 1, -1, -1, device=x.device)
        return (x * weights).sum(-1)

    def _unique_strings(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """n distinct digit strings in random order: shape (n, L)."""
        space = self.digits ** self.length
        if space <= 1 << 22:
            codes = torch.randperm(space, generator=gen, device=self.device)[:n]
        else:  # too many strings to permute: draw codes, drop the (rare) repeats, keep the draw order
            codes = torch.randint(0, space, (2 * n,), generator=gen, device=self.device)
            _, inverse = torch.unique(codes, return_inverse=True)
            first = torch.full((2 * n,), 2 * n, device=self.device).scatter_reduce(
                0, inverse, torch.arange(2 * n, device=self.device), "amin")
            codes = codes[first[first < 2 * n].sort().values[:n]]
        return self._strings(codes)

    def _strings(self, codes: torch.Tensor) -> torch.Tensor:
        """Integers (base ``digits``) as digit strings: (N,) -> (N, L)."""
        powers = self.digits ** torch.arange(self.length - 1, -1, -1, device=codes.device)
        return codes.unsqueeze(1) // powers % self.digits

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Model input of digit strings: ``x SEP rule(x)[:-1]``.

        Shape:
            x (N, L) -> (N, 2L) long.
        """
        if x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(f"expected digit strings of shape (N, {self.length}); got {tuple(x.shape)}")
        sep = torch.full((len(x), 1), self.sep, dtype=torch.long, device=x.device)
        return torch.cat([x.long(), sep, apply_rule(self.rule, x)[:, :-1].long()], dim=1)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s minibatch: inputs (batch_size, 2L) and targets (batch_size, L).

        The strings are uniform over those not in the test set: draw k uniform in [0, #strings - #test)
        and take the k-th string that is not a test string (a ``searchsorted``: no host read). A function of
        (seed, step) alone.
        """
        gen = torch.Generator(device=self.device).manual_seed(derive_seed(self.seed, step, _BATCH_STREAM))
        k = torch.randint(0, self.digits ** self.length - len(self._test_shifted), (self.batch_size,),
                          generator=gen, device=self.device)
        # the k-th non-test code c satisfies c = k + #{test codes <= c} = k + #{i : t_i - i <= k}
        x = self._strings(k + torch.searchsorted(self._test_shifted, k, right=True))
        return self.inputs(x), apply_rule(self.rule, x)

    # ----- model -------------------------------------------------------------------------------------
    def make_model(self, hidden: tuple[int, ...] = (32, 2), model: str = "transformer") -> SequenceTransformer:
        """A :class:`SequenceTransformer` for this task.

        Args:
            hidden: ``(d_model[, n_layers[, n_heads[, dim_feedforward]]])``; n_layers defaults to 2, n_heads
                to 2 (or 1 where d_model is odd), dim_feedforward to 2 * d_model.
            model: "transformer", the only choice ("default", what a run of a task of your own asks for, is it).
        """
        if model not in ("transformer", "default"):
            raise ValueError(f"unknown model {model!r} for task {self.name!r}; expected one of ['transformer']")
        hidden = tuple(int(h) for h in hidden)
        if not 1 <= len(hidden) <= 4:
            raise ValueError(f"hidden must be (d_model[, n_layers[, n_heads[, dim_feedforward]]]); got {hidden}")
        d_model = hidden[0]
        n_layers = hidden[1] if len(hidden) > 1 else 2
        n_heads = hidden[2] if len(hidden) > 2 else (2 if d_model % 2 == 0 else 1)
        ff = hidden[3] if len(hidden) > 3 else None
        return SequenceTransformer(self.vocab, 2 * self.length, d_model, n_layers, n_heads, ff)

    # ----- ES ----------------------------------------------------------------------------------------
    def token_losses(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy at the target positions: logits (..., 2L, vocab), y (..., L) -> (..., L)."""
        target_logits = logits[..., self.length:, :].flatten(0, -2)
        if target_logits.dtype in (torch.float16, torch.bfloat16):  # autocast: the loss in fp32
            target_logits = target_logits.float()
        return F.cross_entropy(target_logits, y.flatten(), reduction="none").view(y.shape)

    def fitness(self, pm: PerturbedModel, step: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Fitness (signs, D_local) of the directions whose noise is drawn, and their mean training loss."""
        x, y = self.batch(step)
        signs, b, d, t = (2 if pm.antithetic else 1), self.batch_size, pm.local_directions, x.shape[1]
        rows = x.view(1, b, 1, t).expand(signs, b, d, t).reshape(-1, t)
        logits = pm(rows).view(signs, b, d, t, self.vocab)
        losses = self.token_losses(logits, y.view(1, b, 1, self.length).expand(signs, b, d, self.length))
        losses = losses.mean(dim=(1, 3))  # over samples and positions: (signs, D)
        return -losses, {"train_loss": losses.mean()}

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy over the target positions of the plain ``model``: the loss a backprop run
        minimises (the ES fitness is minus this loss per member)."""
        return self.token_losses(model(x), y).mean()

    def finish_step(self, pm: PerturbedModel, info: dict) -> None:
        """Nothing to merge after a supervised step."""

    @torch.no_grad()
    def accuracies(self, model: nn.Module, batch: int = 4096) -> dict[str, float]:
        """Token and sequence accuracy (and mean cross-entropy) of the plain model on the held-out set."""
        tokens = sequences = 0
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        for i in range(0, len(self.x_test), batch):
            logits = model(self.x_test[i:i + batch])
            y = self.y_test[i:i + batch]
            right = logits[:, self.length:].argmax(-1) == y
            tokens += right.sum()
            sequences += right.all(-1).sum()
            loss += self.token_losses(logits, y).double().sum()
        n = len(self.x_test)
        return {"token_accuracy": float(tokens) / (n * self.length), "sequence_accuracy": float(sequences) / n,
                "test_loss": float(loss) / (n * self.length)}

    def evaluate(self, model: nn.Module) -> float:
        """Test token accuracy of the plain model."""
        return self.accuracies(model)["token_accuracy"]


def reverse(device="cpu", seed: int = 0, batch_size: int = 32) -> SequenceTask:
    """Reverse a string of 6 digits in [0, 8)."""
    return SequenceTask("reverse", length=6, digits=8, batch_size=batch_size, device=device, seed=seed)


def sort(device="cpu", seed: int = 0, batch_size: int = 32) -> SequenceTask:
    """Sort a string of 6 digits in [0, 8) ascending."""
    return SequenceTask("sort", length=6, digits=8, batch_size=batch_size, device=device, seed=seed)


# hidden = (d_model, n_layers) of the transformer; these reach >= 95% test token accuracy well within 10
# minutes on 2 CPU cores (benchmarks/results/transformer_es_vs_adamw_*.json)
TASKS = {
    "reverse": TaskSpec(batch_maker(reverse), dict(population=256, sigma=0.05, lr=0.01, steps=300,
                                                   hidden=(32, 2), batch_size=32), models=("transformer",), supervised=True,
                        options=BatchOptions),
    "sort": TaskSpec(batch_maker(sort), dict(population=512, sigma=0.05, lr=0.01, steps=1000, hidden=(32, 2),
                                             batch_size=32, lr_schedule="cosine", lr_final=0.1),
                     models=("transformer",), supervised=True, options=BatchOptions),
}
