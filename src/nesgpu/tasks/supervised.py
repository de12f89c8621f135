"""Supervised classification as an ES task: each direction scores a minibatch through the repeats axis."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, default_collate

from ..model import PerturbedModel
from ..noise import derive_seed
from .spec import BatchOptions, TaskSpec, batch_maker

_BATCH_STREAM = 0x6261  # keys the minibatch sampler apart from the noise


class ClassificationTask:
    """Fitness = minus the cross-entropy of each member on a shared minibatch; metric = test accuracy.

    Every direction (and both signs) sees the same minibatch, laid out (sign, sample, direction, ...), so
    the fitness has shape (signs * batch_size -> R = signs, D). The minibatch of step t is drawn from a
    generator seeded by (seed, t): a resumed run sees the same batches.

    Args:
        x_train, y_train, x_test, y_test: tensors; x of shape (N, ...), y of class indices (N,).
        batch_size: samples per member per step.
        device: where the population runs.
        seed: the run seed.
    """

    metric = "test_accuracy"
    default_target = None  # no accuracy counts as solved: runs go to their last step unless --target
    summed_info: frozenset[str] = frozenset()

    def __init__(self, x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor,
                 batch_size: int = 64, device: torch.device | str = "cpu", seed: int = 0, name: str = "custom"):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if len(x_train) != len(y_train) or len(x_test) != len(y_test):
            raise ValueError(f"inputs and labels differ in length: train {len(x_train)} vs {len(y_train)}, "
                             f"test {len(x_test)} vs {len(y_test)}")
        self.device = torch.device(device)
        self.x_train, self.y_train = x_train.to(self.device), y_train.to(self.device).long()
        self.x_test, self.y_test = x_test.to(self.device), y_test.to(self.device).long()
        self.batch_size = batch_size
        self.seed = seed
        self.name = name
        self.input_shape = tuple(x_train.shape[1:])
        self.num_classes = int(max(self.y_train.max(), self.y_test.max())) + 1

    @classmethod
    def from_datasets(cls, train: Dataset, test: Dataset, **kwargs) -> ClassificationTask:
        """Any map-style torch Datasets of (input, label) pairs, materialised once as tensors."""
        x_train, y_train = default_collate([train[i] for i in range(len(train))])
        x_test, y_test = default_collate([test[i] for i in range(len(test))])
        return cls(torch.as_tensor(x_train).float(), torch.as_tensor(y_train), torch.as_tensor(x_test).float(),
                   torch.as_tensor(y_test), **kwargs)

    def make_model(self, hidden: tuple[int, ...] = (64,), model: str = "mlp") -> nn.Module:
        """The classifier.

        Args:
            hidden: "mlp": hidden layer sizes (tanh; inputs are flattened). "cnn": channels of each Conv1d.
            model: "mlp", or "cnn" (a :class:`Conv1dNet`; 1-D inputs only); "default" (what a run of a task of
                your own asks for) is the MLP.
        """
        model = "mlp" if model == "default" else model
        if model == "cnn":
            if len(self.input_shape) != 1:
                raise ValueError(f"model 'cnn' needs 1-D inputs of shape (N, length); got inputs of shape "
                                 f"(N, {', '.join(map(str, self.input_shape))})")
            return Conv1dNet(self.input_shape[0], self.num_classes, hidden)
        if model != "mlp":
            raise ValueError(f"unknown model {model!r} for task {self.name!r}; expected one of ['cnn', 'mlp']")
        sizes = [int(torch.tensor(self.input_shape).prod()), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Linear(a, b), nn.Tanh()]
        layers.append(nn.Linear(sizes[-1], self.num_classes))
        return nn.Sequential(*layers)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator(device=self.device).manual_seed(derive_seed(self.seed, step, _BATCH_STREAM))
        idx = torch.randint(0, len(self.x_train), (self.batch_size,), generator=gen, device=self.device)
        return self.x_train[idx], self.y_train[idx]

    def fitness(self, pm: PerturbedModel, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Fitness (signs, D_local) of the directions whose noise is drawn, and their mean training loss."""
        x, y = self.batch(step)
        signs, b, d = (2 if pm.antithetic else 1), self.batch_size, pm.local_directions
        logits = pm.shared_input(x).view(signs, b, d, -1)  # rows (sign, sample, direction), never materialised
        target = y.view(1, b, 1).expand(signs, b, d)
        losses = F.cross_entropy(logits.permute(0, 3, 1, 2), target, reduction="none").mean(1)  # (signs, D)
        return -losses, {"train_loss": losses.mean()}

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of the plain ``model`` on (x, y): the loss a backprop run minimises (the ES
        fitness is minus this loss per member)."""
        return F.cross_entropy(model(x).float(), y)

    def finish_step(self, pm: PerturbedModel, info: dict) -> None:
        """Nothing to merge after a supervised step."""

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batch: int = 4096) -> float:
        """Test accuracy of the plain model."""
        correct = 0
        for i in range(0, len(self.x_test), batch):
            correct += (model(self.x_test[i:i + batch]).argmax(-1) == self.y_test[i:i + batch]).sum()
        return float(correct) / len(self.x_test)


class Conv1dNet(nn.Module):
    """A 1-D convolutional classifier: each stage a Conv1d (kernel 5, stride 2, padding 2) and a ReLU, then
    flatten and one Linear.

    Args:
        length: features per input.
        num_classes: outputs.
        channels: output channels of each convolution (at least one).

    Shape:
        x (N, length) -> logits (N, num_classes); inside, (N, 1, length) -> (N, C, length'). Rows stay on
        dim 0, so a population of N = R * D rows runs as one batch.
    """

    def __init__(self, length: int, num_classes: int, channels: tuple[int, ...] = (32, 32, 32)):
        super().__init__()
        channels = tuple(int(c) for c in channels)
        if not channels or min(channels) < 1:
            raise ValueError(f"channels must be one or more positive sizes; got {channels}")
        self.length = length
        stages: list[nn.Module] = []
        size = length
        for c_in, c_out in zip((1, *channels), channels):
            stages += [nn.Conv1d(c_in, c_out, kernel_size=5, stride=2, padding=2), nn.ReLU()]
            size = (size - 1) // 2 + 1
        self.features = nn.Sequential(*stages)
        self.head = nn.Linear(channels[-1] * size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.length:
            raise ValueError(f"expected inputs of shape (N, {self.length}); got {tuple(x.shape)}")
        return self.head(self.features(x.unsqueeze(1)).flatten(1))


def digits(device="cpu", seed: int = 0, batch_size: int = 64, test_fraction: float = 0.2) -> ClassificationTask:
    """sklearn's 8x8 digits (1797 images, shipped with sklearn), scaled to [0, 1]; a stratified split."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the digits task needs scikit-learn: pip install 'nesgpu[train]'") from e
    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data / 16.0, data.target, test_size=test_fraction, random_state=0, stratify=data.target)
    as_x = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return ClassificationTask(as_x(x_train), torch.tensor(y_train), as_x(x_test), torch.tensor(y_test),
                              batch_size=batch_size, device=device, seed=seed, name="digits")


def mnist1d(device="cpu", seed: int = 0, batch_size: int = 64) -> ClassificationTask:
    """MNIST-1D (Greydanus 2020), generated offline by the mnist1d package's ``make_dataset``."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the mnist1d task needs the mnist1d package: pip install 'nesgpu[train]'") from e
    data = make_dataset(get_dataset_args())
    as_x = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return ClassificationTask(as_x(data["x"]), torch.tensor(data["y"]), as_x(data["x_test"]),
                              torch.tensor(data["y_test"]), batch_size=batch_size, device=device, seed=seed,
                              name="mnist1d")


# tuned on a 2-core CPU from starting points in the ES literature (Salimans et al. 2017): OpenAI-ES + Adam;
# population = members per step (both signs counted), batch_size = samples per member per step
TASKS = {
    "digits": TaskSpec(batch_maker(digits), dict(population=512, sigma=0.1, lr=0.005, steps=1000, hidden=(64,),
                                                 batch_size=128, weight_decay=0.005), supervised=True, options=BatchOptions),
    "mnist1d": TaskSpec(batch_maker(mnist1d), dict(population=512, sigma=0.05, lr=0.005, steps=1500,
                                                   hidden=(128,), batch_size=64), models=("mlp", "cnn"), supervised=True,
                        # hidden = the Conv1d channels of "cnn"
                        model_defaults={"cnn": dict(hidden=(32, 32, 32), lr=0.01, steps=1200)}, options=BatchOptions),
}
