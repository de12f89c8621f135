"""Classification from datasets that stay on the host: a DataLoader feeds each step's minibatch.

Workers load and collate samples ahead of time (``num_workers``, ``persistent_workers``) into pinned
memory (``pin_memory`` on CUDA), the copy to the device is non-blocking, and normalisation runs on the
device. The minibatch of step t is still a function of (seed, t): the batch sampler draws step t's
indices from its own seeded generator, so a resumed run sees the same data.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..noise import derive_seed
from .supervised import _BATCH_STREAM, ClassificationTask


class StepBatchSampler(Sampler[list[int]]):
    """Yields the index batch of steps ``first_step``, ``first_step + 1``, ... (with replacement)."""

    def __init__(self, size: int, batch_size: int, seed: int, first_step: int = 1):
        self.size, self.batch_size, self.seed, self.first_step = size, batch_size, seed, first_step

    def indices(self, step: int) -> list[int]:
        gen = torch.Generator().manual_seed(derive_seed(self.seed, step, _BATCH_STREAM))
        return torch.randint(0, self.size, (self.batch_size,), generator=gen).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        step = self.first_step
        while True:
            yield self.indices(step)
            step += 1

    def __len__(self) -> int:  # endless; DataLoader only needs it for progress reporting
        return 2**31


class StreamingClassificationTask(ClassificationTask):
    """Like :class:`ClassificationTask`, but the training data stays a host Dataset read by a DataLoader.

    Args:
        train, test: map-style datasets of (input tensor, label). The test set is loaded once.
        batch_size, device, seed: as for ClassificationTask.
        num_workers: DataLoader worker processes (0: load in the main process).
        mean, std: per-feature normalisation, applied on the device (broadcast against an input).
        first_step: the step the next batch belongs to (set it to the resumed step + 1).
    """

    def __init__(self, train: Dataset, test: Dataset, batch_size: int = 64, device="cpu", seed: int = 0,
                 num_workers: int = 2, mean: float | torch.Tensor = 0.0, std: float | torch.Tensor = 1.0,
                 first_step: int = 1, name: str = "stream"):
        device = torch.device(device)
        x_test, y_test = (torch.stack([torch.as_tensor(t) for t in items]) for items in zip(*[test[i] for i in range(len(test))]))
        x0, y0 = train[0]
        # the base class only needs shapes and classes from the training data: keep one sample
        super().__init__(torch.as_tensor(x0).unsqueeze(0).float(), torch.as_tensor([y0]), x_test.float(), y_test,
                         batch_size=batch_size, device=device, seed=seed, name=name)
        self.num_classes = max(self.num_classes, int(max(int(train[i][1]) for i in range(len(train)))) + 1)
        self.mean = torch.as_tensor(mean, dtype=torch.float32, device=device)
        self.std = torch.as_tensor(std, dtype=torch.float32, device=device)
        self.x_test = self.normalize(self.x_test)
        self.sampler = StepBatchSampler(len(train), batch_size, seed, first_step)
        self.loader = DataLoader(train, batch_sampler=self.sampler, num_workers=num_workers,
                                 pin_memory=device.type == "cuda", persistent_workers=num_workers > 0)
        self._batches = iter(self.loader)
        self._current: tuple[int, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._next_step = first_step

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - self.mean) / self.std

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s minibatch on the device (the same one for every chunk of the step)."""
        if self._current is not None and self._current[0] == step:
            return self._current[1]
        if step != self._next_step:
            raise ValueError(f"the data stream is at step {self._next_step}; got a request for step {step} "
                             f"(build the task with first_step={step} to start there)")
        x, y = next(self._batches)
        x = self.normalize(x.to(self.device, non_blocking=True))
        y = y.to(self.device, non_blocking=True).long()
        self._current = (step, (x, y))
        self._next_step = step + 1
        return x, y
