"""The one owner of a step's directions: blocks, their noise, the forward passes, the exchange between
processes, and the update. Nothing else calls ``PerturbedModel.set_noise`` or ``PerturbedModel.update``.

The forward runs over this process's share of the directions (:class:`~nesgpu.distributed.Ranks`) in blocks
of ``chunk`` (sized by :class:`~nesgpu.blocks.Blocks`); the update runs over all directions (every process
computes the same update) in blocks whose noise is drawn again where a later block replaced it.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch

from .blocks import Blocks
from .distributed import Ranks
from .layers import HALF
from .layers.layout import member_weights
from .memory import out_of_memory
from .model import PerturbedModel
from .precision import autocast_dtype, slow_precision_note
from .rounding import rounding_generator


@runtime_checkable
class ShapesFitness(Protocol):
    """A task that shapes the whole population's fitness (R, D) once it is gathered from every block and
    process, before the strategy sees it: e.g. per-prompt normalisation of a generation task's rewards."""

    def shape(self, fitness: torch.Tensor) -> torch.Tensor:
        """The shaped fitness, of the same shape."""
        ...


@runtime_checkable
class DescribesFitness(Protocol):
    """A task whose raw fitness means something to its user (a generation task's rewards): before any shaping,
    :meth:`describe` turns the whole population's fitness into the step's statistics (the reward's mean, spread,
    best). ``describes`` names every statistic a user should read for the task (these and any of its
    :meth:`~nesgpu.tasks.protocol.Task.fitness`'s): the trainer shows them in the progress line in place of
    the fitness and gives each a column of metrics.csv."""

    describes: tuple[str, ...]

    def describe(self, fitness: torch.Tensor) -> dict[str, torch.Tensor]:
        """Scalar tensors (on the fitness's device: no host reads) from the raw fitness (R, D)."""
        ...


@runtime_checkable
class LogsMetrics(Protocol):
    """A task whose reward functions log scalars of their own (TRL's ``log_metric``): the trainer takes them
    after every step and every evaluation, and writes them beside the step's statistics. A step's evaluation
    starts by dropping what is pending (a step evaluated again after a fallback or out of memory counts once)."""

    def logged_metrics(self) -> dict[str, float]:
        """Each name's mean since the last call; the next call starts afresh."""
        ...


class Evaluation(NamedTuple):
    """What one step's population gives back, gathered over every process."""

    fitness: torch.Tensor  # (R, D), higher is better
    sq_norms: torch.Tensor | None  # (D,) ||z_d||^2 when asked for, else None
    info: dict  # the task's step statistics, merged over blocks and processes


class Population:
    """Evaluates and updates the population of ``pm``, block by block, over the processes of ``ranks``.

    Args:
        chunk: directions per block: an int, "auto" (the largest block whose noise fits in half the free
            memory, halved on out-of-memory with the step kept), or None (the whole share at once).
        precision: "fp32", "bf16" or "fp16" (the forward under autocast).
        first_chunk: with chunk "auto", the block to start from at most (a memory plan's).

    A population whose noise cannot fit even in blocks of one direction (or, with a fixed chunk, in blocks
    of that size) is refused when this is built, with the memory it would need.
    """

    def __init__(self, pm: PerturbedModel, ranks: Ranks | None = None, chunk=None, precision: str = "fp32",
                 log=print, first_chunk: int | None = None):
        if not isinstance(pm, PerturbedModel):
            raise TypeError(f"pm must be a PerturbedModel; got {type(pm).__name__}")
        self.pm, self.log = pm, log
        self.ranks = ranks or Ranks()
        self.share = self.ranks.share(pm.directions)
        self.blocks = Blocks(pm, self.share, self.ranks.distributed, chunk, log, first_chunk)
        self.step = 0  # the step last evaluated, whose noise the update uses
        self._protocols: tuple = (None, ())  # (task, which optional protocols it meets): see _meets
        self.device = device = next(pm.model.parameters()).device
        self.blocks.check_memory(device)
        dtype = autocast_dtype(precision)
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else None
        note = slow_precision_note(device, dtype) if dtype else None
        if note:
            log(note)

    @property
    def directions(self) -> int:
        return self.pm.directions

    def parameters_of_layers(self) -> list[torch.nn.Parameter]:
        """The perturbed parameters themselves (a half-precision one, not its master), module by module."""
        return [p for layer in self.pm.layers.values() for p in layer.perturbed_parameters().values()]

    def parameters(self) -> list[torch.nn.Parameter]:
        """The model's parameters in its own order (an optimizer's state is saved by that order), each
        half-precision one replaced by its float32 master: what the update writes ``.grad`` into."""
        masters = {id(p): value for p, value in zip(self.parameters_of_layers(), self.pm.parameters())}
        return [masters.get(id(p), p) for p in self.pm.model.parameters()]

    def free_memory(self) -> None:
        self.pm.free_memory()

    @property
    def chunk(self) -> int:
        """Directions per forward block (see :class:`~nesgpu.blocks.Blocks`)."""
        return self.blocks.chunk

    def _draw(self, step: int, block: range, sigma: float) -> None:
        """The noise of ``block`` at ``step``, evaluated at the strategy's ``sigma`` of the step."""
        if not self.pm.has_noise(step, block) or self.pm.sigma != sigma:
            self.pm.set_noise(step=step, directions=block, sigma=sigma)

    # ----- the step ----------------------------------------------------------------------------------
    def evaluate(self, task, step: int, sigma: float, sq_norms: bool = False, finish: bool = True,
                 shape: bool = True) -> Evaluation:
        """Fitness (R, D) of the whole population at ``step`` with noise scale ``sigma`` (every process's),
        ||z_d||^2 when ``sq_norms``, and the step's statistics. With chunk "auto", an out-of-memory error
        halves the chunk and evaluates the step again. ``finish=False`` leaves the task as it was (no
        ``finish_step``: an RL task's observation statistics do not take in what the evaluation saw), for
        evaluations that are not a training step (the sigma probe); ``shape=False`` returns the raw fitness of a task
        that shapes its own (the probe reads rewards)."""
        if not self.blocks.sized:
            self.blocks.size_for(task, self.device)
        while True:
            try:
                return self.pm.with_fallbacks(lambda: self._evaluate(task, step, sigma, sq_norms, finish, shape))
            except RuntimeError as e:  # torch.OutOfMemoryError is one too
                if not out_of_memory(e) or not self.blocks.halve():
                    raise
                self.pm.free_memory()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                self.log(f"out of memory at step {step}: retrying the step with chunk size {self.chunk}")

    def _meets(self, task) -> tuple[bool, bool, bool]:
        """Whether ``task`` is a LogsMetrics, DescribesFitness and ShapesFitness, checked once per task (a runtime
        Protocol's isinstance costs ~10 us, every step)."""
        if self._protocols[0] is not task:
            self._protocols = (task, tuple(isinstance(task, p) for p in (LogsMetrics, DescribesFitness, ShapesFitness)))
        return self._protocols[1]

    def _evaluate(self, task, step: int, sigma: float, sq_norms: bool, finish: bool, shape: bool) -> Evaluation:
        logs, describes, shapes = self._meets(task)
        if logs:  # what an earlier try of this step logged is not this step's
            task.logged_metrics()
        parts, norms, totals = [], [], _BlockTotals(task.summed_info)
        for block in self.blocks.forward_blocks():
            self._draw(step, block, sigma)
            if self.autocast is None:
                fitness, info = task.fitness(self.pm, step)
            else:
                with self.autocast():
                    fitness, info = task.fitness(self.pm, step)
            check_block_fitness(task, fitness, info, len(block))
            parts.append(fitness.to(torch.float32 if fitness.dtype in (torch.bfloat16, torch.float16)
                                    else fitness.dtype))
            if sq_norms:
                norms.append(self.pm.noise_sq_norms())
            totals.add(len(block), info)
        self.step = step
        local = totals.values()
        if sq_norms:  # zero elsewhere, so that the exchange's sum over processes places each share (exactly)
            local["__sq_norms__"] = torch.cat(norms)
            if self.ranks.distributed:
                padded = local["__sq_norms__"].new_zeros(self.pm.directions)
                padded[self.share.start:self.share.stop] = local["__sq_norms__"]
                local["__sq_norms__"] = padded
        try:
            fitness, info = self.ranks.exchange(torch.cat(parts, dim=1), local)
        except RuntimeError as e:
            raise RuntimeError(f"rank {self.ranks.rank}: exchanging fitness at step {step} failed; another "
                               f"process died or hung ({e})") from e
        norms = info.pop("__sq_norms__", None)
        info = {k: v if k in task.summed_info else v / self.pm.directions for k, v in info.items()}
        if finish:
            task.finish_step(self.pm, info)
        if describes:  # the raw fitness, before shaping makes it a mean of zero
            info.update(task.describe(fitness))
        if shapes and shape:  # over the whole population, the same in every process
            fitness = task.shape(fitness)
        return Evaluation(fitness, norms, info)

    def update(self, weights: torch.Tensor, sigma: float) -> None:
        """Add the ES estimate of the last evaluated step, with ``weights`` (R, D) or (D,) over all
        directions (lower is better), to ``.grad``: block by block, each block's noise drawn again where
        another one replaced it. The weights' finiteness is not checked here (a host read per block): the
        trainer refuses non-finite fitness before shaping (:func:`~nesgpu.strategies.base.fitness_statistics`).
        Outside the step's subspace (``PerturbedModel.set_subspace``) a ``.grad`` stays as it was (None: the
        optimizer skips the parameter)."""
        untouched = [p for p in self.pm.outside_subspace(self.step) if p.grad is None]
        self.update_scaled(weights, sigma)
        for p in untouched:
            p.grad = None

    def apply(self, weights: torch.Tensor, sigma: float, rule) -> None:
        """Step the weights in place by ``rule`` (:class:`~nesgpu.inplace.InPlaceSGD`, :class:`~nesgpu.inplace.
        InPlaceAdam`) from the ES estimate of the last evaluated step, ``g = 1/(D sigma) sum_d w_d z_d`` with
        ``weights`` (R, D) or (D,) over all directions (lower is better): seed replay, layer by layer and slice by
        slice, no ``.grad`` and no float32 master. The noise of every direction is drawn at once, whatever the
        chunk or the processes, so every run computes the same update; half-precision weights (and Adam's moments)
        take it by stochastic rounding seeded by (seed, step, parameter). Modules outside the step's subspace
        (``PerturbedModel.set_subspace``) are not stepped."""
        pm, step = self.pm, self.step
        if pm.keeps_masters and any(p.dtype in HALF for p in self.parameters_of_layers()):
            raise ValueError("Population.apply writes the update into the weights, but this half-precision model "
                             "has float32 masters that an optimizer steps; build PerturbedModel(..., masters=False)")
        self._draw(step, range(pm.directions), sigma)
        coef = member_weights(weights, pm.directions, pm.antithetic, None, check_finite=False)
        coef = coef * (rule.coef_factor / (pm.directions * float(sigma)))  # SGD's -lr folded in: g is the step
        rule.begin()
        inside = pm.subspace_modules(step)
        for name, layer in pm.layers.items():
            if layer.perturbs and (inside is None or name in inside):
                key = layer.layer_key
                layer.apply_update_(coef, lambda slot, device, key=key: rounding_generator(
                    device, pm.seed, step, key, slot), rule)

    def update_scaled(self, weights: torch.Tensor, sigma: float, scale_weights: torch.Tensor | None = None,
                      means: bool = False) -> tuple[dict, dict]:
        """:meth:`update`, and the statistics a per-parameter sigma adapts by, summed over the blocks (the noise
        drawn once per block for all): with ``scale_weights`` (S, D), ``sum_d w_d (z_d o z_d - 1)`` of every
        scaled parameter, and with ``means`` also ``sum_d w_d z_d`` (the members' signs applied)."""
        if scale_weights is None:
            self._update_summing(weights, sigma)
            return {}, {}
        pm = self.pm
        return self._update_summing(weights, sigma, lambda part: (
            pm.scale_statistics(scale_weights[..., part]), pm.scale_means(scale_weights[..., part]) if means else {}))

    def update_covariance(self, weights: torch.Tensor, sigma: float, statistic_weights: torch.Tensor,
                          natural: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`update`, and what a full covariance adapts by, summed over the blocks, with ``statistic_weights``
        (S, D): CMA-ES's ``PerturbedModel.covariance_statistics``, or with ``natural`` xNES's
        ``natural_statistics``."""
        statistics = self.pm.natural_statistics if natural else self.pm.covariance_statistics
        return self._update_summing(weights, sigma, lambda part: statistics(statistic_weights[..., part]))

    def _update_summing(self, weights: torch.Tensor, sigma: float, statistics=None):
        """The update block by block (each block's noise drawn where another replaced it), and ``statistics(block)``
        of each block, summed: tensors, or tuples and dicts of them, added part by part."""
        total = None
        for block in self.blocks.update_blocks():
            self._draw(self.step, block, sigma)
            self.pm.update(weights[..., block.start:block.stop], sigma, check_finite=False)
            if statistics is not None:
                part = statistics(slice(block.start, block.stop))
                total = part if total is None else _added(total, part)
        return total


def _added(total, part):
    """``total + part`` for tensors, and part by part for tuples and dicts of them (a key only one holds is kept)."""
    if isinstance(total, tuple):
        return tuple(_added(a, b) for a, b in zip(total, part))
    if isinstance(total, dict):
        return {**part, **{k: v if k not in part else _added(v, part[k]) for k, v in total.items()}}
    return total + part


def check_block_fitness(task, fitness, info, directions: int) -> None:
    """What ``task.fitness`` gave for a block of ``directions``: a real tensor (R, directions) and a dict; else
    an error naming the task and what was expected (not a failure deep inside the exchange or the strategy)."""
    name = type(task).__name__
    if not isinstance(fitness, torch.Tensor) or fitness.is_complex() or fitness.dtype == torch.bool:
        got = fitness.dtype if isinstance(fitness, torch.Tensor) else type(fitness).__name__
        raise TypeError(f"{name}.fitness must return (a real torch.Tensor of shape (R, {directions}), a dict); "
                        f"got {got} as the fitness")
    if fitness.dim() != 2 or fitness.shape[1] != directions:
        raise ValueError(f"{name}.fitness must return fitness of shape (R, {directions}): R repeats of the "
                         f"block's {directions} directions; got shape {tuple(fitness.shape)}")
    if not isinstance(info, dict):
        raise TypeError(f"{name}.fitness must return (fitness, a dict of statistics); got {type(info).__name__} as "
                        f"the statistics")


class _BlockTotals:
    """This process's step statistics from its blocks: the task's summed ones added, the others weighted by
    the block's directions (divided by the population once the processes' totals are added)."""

    def __init__(self, summed: frozenset[str]):
        self.summed, self.totals = summed, {}

    def add(self, size: int, info: dict) -> None:
        for key, value in info.items():
            part = value if key in self.summed else size * torch.as_tensor(value, dtype=torch.float64)
            self.totals[key] = part if key not in self.totals else self.totals[key] + part

    def values(self) -> dict:
        return dict(self.totals)


__all__ = ["DescribesFitness", "Evaluation", "LogsMetrics", "Population", "ShapesFitness"]
