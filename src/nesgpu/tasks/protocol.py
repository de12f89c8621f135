"""What a task gives the trainer: the one written contract between ``nesgpu.tasks`` and ``nesgpu.train``.

A task owns its data or environments. The trainer asks it for the population's fitness once per block of
directions, hands it the step's merged statistics, and asks it to evaluate the plain model; a task that
builds its own model (:class:`ModelMaker`) may be trained without one. Any object with these members can be
trained: ``nesgpu.train.train(cfg, task=my_task, model=my_model)``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ..model import PerturbedModel
from ..population import DescribesFitness, LogsMetrics, ShapesFitness  # noqa: F401 (parts of the protocol a task may meet)


@runtime_checkable
class Task(Protocol):
    """The members a task must have.

    Attributes:
        metric: the name of what :meth:`evaluate` returns (higher is better), e.g. ``"test_accuracy"``; it
            names a column of metrics.csv and the ``value`` of summary.json.
        default_target: the metric at which the task counts as solved (a gymnasium env's
            ``reward_threshold``), or None; ``--target`` overrides it.
        summed_info: the keys of :meth:`fitness`'s statistics that add up over blocks and processes (counts,
            sums); every other entry is a mean over the block's directions.
    """

    metric: str
    default_target: float | None
    summed_info: frozenset[str]

    def fitness(self, pm: PerturbedModel, step: int) -> tuple[torch.Tensor, dict]:
        """Fitness (R, D_local) of the directions whose noise is drawn (higher is better), evaluated in one
        population call inside ``pm``, and the block's statistics (tensors on the device: no host reads)."""
        ...

    def finish_step(self, pm: PerturbedModel, info: dict) -> None:
        """Called once per step with the statistics merged over every block and process (e.g. to update
        observation statistics with what the whole population saw)."""
        ...

    def evaluate(self, model: nn.Module) -> float:
        """The metric of the plain (unperturbed) model."""
        ...


@runtime_checkable
class SavesModel(Protocol):
    """A task that writes the trained model in a form of its own too (a language model: save_pretrained)."""

    def save(self, model: nn.Module, directory) -> None:
        """Write ``model`` into ``directory``."""
        ...


@runtime_checkable
class KeepsSamples(Protocol):
    """A task whose :meth:`Task.evaluate` keeps what the model produced (a language model's completions):
    the trainer appends them to the run's ``samples.jsonl`` at every evaluation."""

    samples: list[dict]


@runtime_checkable
class Fingerprinted(Protocol):
    """A task whose data can change between a run and its resume (a prompts file): the checkpoint records
    :meth:`data_fingerprint`, and a resume on other data is refused."""

    def data_fingerprint(self) -> str:
        """A short hash of what the task trains and evaluates on."""
        ...


@runtime_checkable
class ComparesToStart(Protocol):
    """A task that measures how far the model has moved from the run's starting model (a language model's
    ``kl`` and change of ``drift_nll``). Where ``wants_start``, the trainer keeps the starting weights (also in
    the checkpoint) and hands them over once: an object whose ``loaded()`` context holds the model at them."""

    wants_start: bool

    def compare_to(self, start) -> None:
        """Measure from ``start`` (None: nothing to measure from)."""
        ...


@runtime_checkable
class ReportsEvaluation(Protocol):
    """A task whose :meth:`Task.evaluate` measures more than its metric: the trainer adds
    :meth:`evaluation_info` to the evaluation's row (metrics.csv, trackers)."""

    def evaluation_info(self) -> dict[str, float]:
        """The latest evaluation's further columns."""
        ...


@runtime_checkable
class ModelMaker(Protocol):
    """A task that builds its own model (every built-in task does): ``train`` needs no ``model=`` then."""

    def make_model(self, hidden: tuple[int, ...], model: str) -> nn.Module:
        """A fresh plain model of architecture ``model`` (one of the task's choices, or "default": a run of a
        task of your own asks for its default model) with ``hidden`` sizes."""
        ...


@runtime_checkable
class DifferentiableTask(Task, Protocol):
    """A task that a gradient baseline (``--strategy backprop``) can train as well: supervised tasks.

    Attributes:
        batch_size: samples per minibatch.
        device: where the data lives.
    """

    batch_size: int
    device: torch.device

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The minibatch (inputs, targets) of ``step``: a function of the run's seed and the step."""
        ...

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean loss of the plain ``model`` on (x, y), differentiable (minus the ES fitness)."""
        ...


TASK_MEMBERS = ("metric", "default_target", "summed_info", "fitness", "finish_step", "evaluate")
DIFFERENTIABLE_MEMBERS = ("batch_size", "device", "batch", "loss")


def check_task(task: object) -> Task:
    """``task`` if it is a :class:`Task`; else a TypeError naming the members it lacks."""
    if not isinstance(task, Task):
        missing = [name for name in TASK_MEMBERS if not hasattr(task, name)]
        raise TypeError(f"a task needs {missing} (see nesgpu.tasks.protocol.Task); got {type(task).__name__}")
    return task


def check_differentiable(task: object) -> DifferentiableTask:
    """``task`` if a backprop run can train it (a :class:`DifferentiableTask`); else a TypeError naming what
    is missing."""
    check_task(task)
    if not isinstance(task, DifferentiableTask):
        missing = [name for name in DIFFERENTIABLE_MEMBERS if not hasattr(task, name)]
        raise TypeError(f"backprop needs a task with {missing} (see nesgpu.tasks.protocol.DifferentiableTask); "
                        f"got {type(task).__name__}")
    return task


__all__ = ["ComparesToStart", "DIFFERENTIABLE_MEMBERS", "DescribesFitness", "DifferentiableTask", "Fingerprinted",
           "LogsMetrics", "ModelMaker", "ReportsEvaluation", "ShapesFitness", "TASK_MEMBERS", "Task",
           "check_differentiable", "check_task"]
