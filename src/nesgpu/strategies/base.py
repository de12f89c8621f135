"""The ask/tell shape that every strategy shares, over a PerturbedModel and a torch optimizer."""

from __future__ import annotations

from typing import ClassVar

import torch

from ..model import PerturbedModel
from .schedules import Schedule


def check_fitness(fitness: torch.Tensor, step: int, directions: int, antithetic: bool, read: bool = True
                  ) -> torch.Tensor:
    """Validate a population's fitness of shape (R, D): R even with antithetic sampling, and (when ``read``)
    finite, which reads it back from the device."""
    if not isinstance(fitness, torch.Tensor):
        raise TypeError(f"fitness must be a torch.Tensor of shape (R, {directions}); got {type(fitness).__name__}")
    if fitness.dim() == 1:
        fitness = fitness.unsqueeze(0)
    if fitness.dim() != 2 or fitness.shape[1] != directions:
        raise ValueError(f"fitness must have shape (R, {directions}) or ({directions},); got {tuple(fitness.shape)}")
    if antithetic and fitness.shape[0] % 2:
        raise ValueError(f"antithetic fitness needs an even number of repeats; got shape {tuple(fitness.shape)}")
    if read and not torch.isfinite(fitness).all():  # reading fitness is the one host sync a step allows
        r, d = (~torch.isfinite(fitness)).nonzero()[0].tolist()
        raise ValueError(f"non-finite fitness {fitness[r, d].item()} at step {step}, member (repeat {r}, "
                         f"direction {d}); check the task or lower sigma / lr")
    return fitness


class Strategy:
    """ask() draws the step's noise; the caller evaluates the population; tell(fitness) steps the model.

    Fitness is higher-is-better, of shape (R, D) as laid out by the population input. A caller that
    evaluates the directions in blocks (to bound memory) calls :meth:`begin_step`, draws each block's noise
    with ``pm.set_noise(step, directions=block)`` as it evaluates it, and passes the blocks to
    :meth:`tell`, which updates block by block (redrawing a block's noise when another one replaced it).

    Args:
        pm: the perturbed model.
        optimizer: any torch optimizer over the model's parameters.
        sigma_schedule, lr_schedule: factors of the initial sigma / lr per step (default constant).
    """

    name = "strategy"
    default_lr: ClassVar[float] = 0.01  # the step size its default optimizer expects
    # the training configuration's options this strategy takes, and the constructor argument each sets
    config_options: ClassVar[dict[str, str]] = {}

    @classmethod
    def uses_observation_statistics(cls, **options) -> bool:
        """Whether RL tasks normalise observations by running statistics under this strategy (built with
        ``options``): yes unless a strategy says otherwise (ARS V1 uses raw observations)."""
        return True

    def __init__(self, pm: PerturbedModel, optimizer: torch.optim.Optimizer,
                 sigma_schedule: Schedule | None = None, lr_schedule: Schedule | None = None):
        if not isinstance(pm, PerturbedModel):
            raise TypeError(f"pm must be a PerturbedModel; got {type(pm).__name__}")
        self.pm = pm
        self.optimizer = optimizer
        self.step = 0  # completed tells
        self.sigma0 = pm.sigma
        self.sigma_schedule = sigma_schedule
        self.lr_scheduler = None if lr_schedule is None else torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule)

    # ----- the loop ----------------------------------------------------------------------------------
    def begin_step(self) -> int:
        """Set sigma for the coming step (its schedule) and return the step's number (completed + 1)."""
        if self.sigma_schedule is not None:
            self.pm.sigma = self.sigma0 * self.sigma_schedule(self.step)
        return self.step + 1

    def ask(self) -> None:
        """:meth:`begin_step`, then draw the noise of every direction for it."""
        self.pm.set_noise(step=self.begin_step())

    def tell(self, fitness: torch.Tensor, extra: dict[str, torch.Tensor] | None = None,
             blocks: list[range] | None = None) -> dict[str, float]:
        """Turn fitness into an update, step the optimizer, and return the step's statistics.

        ``extra`` scalars (e.g. a training loss) are read back together with the fitness statistics: one
        host read per step, which also checks that the fitness is finite. ``blocks`` (default: all
        directions at once) are the ranges of directions the update runs over, one noise draw each.
        """
        step = self.step + 1
        fitness = check_fitness(fitness, step, self.pm.directions, self.pm.antithetic, read=False)
        blocks = [range(self.pm.directions)] if blocks is None else _check_blocks(blocks, self.pm.directions)
        extra = extra or {}
        values = torch.stack([torch.isfinite(fitness).all().to(fitness.dtype), fitness.mean(), fitness.max(),
                              fitness.min(), *(torch.as_tensor(v, dtype=fitness.dtype, device=fitness.device)
                                               for v in extra.values())]).tolist()
        if not values[0]:
            check_fitness(fitness, step, self.pm.directions, self.pm.antithetic)  # raises, naming the member
        weights = self.weights(fitness)
        self.optimizer.zero_grad(set_to_none=True)
        for block in blocks:
            if not self.pm.has_noise(step, block):
                self.pm.set_noise(step=step, directions=block)
            self.pm.update(weights[..., block.start:block.stop])
            self.on_update_block(block)
        self.before_optimizer_step()
        self.optimizer.step()
        self.after_optimizer_step(fitness)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.step += 1
        stats = {"fitness_mean": values[1], "fitness_max": values[2], "fitness_min": values[3],
                 "sigma": self.pm.sigma, "lr": self.optimizer.param_groups[0]["lr"]}
        stats.update(zip(extra, values[4:]))
        return stats

    # ----- what a strategy defines -------------------------------------------------------------------
    def weights(self, fitness: torch.Tensor) -> torch.Tensor:
        """Weights for ``pm.update`` (lower is better there), of shape (R, D) or (D,)."""
        raise NotImplementedError

    def on_update_block(self, block: range) -> None:
        """Called after the update of each block of directions, while its noise is drawn."""

    def before_optimizer_step(self) -> None:
        pass

    def after_optimizer_step(self, fitness: torch.Tensor) -> None:
        pass

    # ----- state -------------------------------------------------------------------------------------
    @property
    def base_lr(self) -> float:
        """The step size of the first parameter group before the schedule's factor."""
        return self.base_lrs[0]

    @property
    def base_lrs(self) -> list[float]:
        """Each parameter group's step size before the schedule's factor."""
        if self.lr_scheduler is None:
            return [group["lr"] for group in self.optimizer.param_groups]
        return [group.get("initial_lr", group["lr"]) for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        """Step, sigma and the optimizer's state. The lr schedule is not stored: the one this strategy was
        built with applies from the loaded step on (a resumed run may change it)."""
        return {"step": self.step, "sigma": self.pm.sigma, "sigma0": self.sigma0, "lr": self.base_lrs,
                "optimizer": self.optimizer.state_dict()}

    def set_lr(self, lr: float) -> None:
        """A new base step size from the current step on (a schedule keeps scaling it): the first group gets
        ``lr`` and every other group keeps its ratio to the first. A group with a ``max_speed`` (ClipUp:
        twice the step size) has it scaled by the same factor."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"lr must be a positive number; got {lr!r}")
        ratio = lr / self.base_lr
        for group in self.optimizer.param_groups:
            if "max_speed" in group:
                group["max_speed"] = group["max_speed"] * ratio
        self._set_base_lrs([base * ratio for base in self.base_lrs])

    def _set_base_lrs(self, bases: list[float]) -> None:
        """Each group's base step size, with the schedule's factor at the current step applied."""
        factor = 1.0 if self.lr_scheduler is None else self.lr_scheduler.lr_lambdas[0](self.step)
        for group, base in zip(self.optimizer.param_groups, bases):
            if self.lr_scheduler is not None:
                group["initial_lr"] = base
            group["lr"] = base * factor
        if self.lr_scheduler is not None:
            self.lr_scheduler.base_lrs = list(bases)
            self.lr_scheduler.last_epoch = self.step
            self.lr_scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; the saved base step sizes are set under this strategy's own schedule."""
        self.step = int(state["step"])
        self.pm.sigma = float(state["sigma"])
        self.sigma0 = float(state["sigma0"])
        self.pm.step = self.step
        self.optimizer.load_state_dict(state["optimizer"])
        groups = self.optimizer.param_groups
        if "lr" in state:
            bases = state["lr"] if isinstance(state["lr"], list) else [float(state["lr"])] * len(groups)
        elif "lr_scheduler" in state:  # checkpoints of nesgpu 0.1.0 stored the scheduler
            bases = list(state["lr_scheduler"]["base_lrs"])
        else:
            bases = [group["lr"] for group in groups]
        if len(bases) != len(groups):
            raise ValueError(f"the state has {len(bases)} parameter groups' step sizes; the optimizer has "
                             f"{len(groups)}")
        for group in groups:  # the loaded groups hold the saving run's scheduled lr
            group.pop("initial_lr", None)
        self._set_base_lrs([float(b) for b in bases])


def _check_blocks(blocks: list[range], directions: int) -> list[range]:
    """Blocks must be non-empty contiguous ranges that cover [0, directions) in order."""
    blocks = list(blocks)
    ends = [0] + [b.stop for b in blocks]
    if not blocks or any(not isinstance(b, range) or b.step != 1 or b.start != start or b.stop <= b.start
                         for b, start in zip(blocks, ends)) or ends[-1] != directions:
        raise ValueError(f"blocks must be ranges covering the {directions} directions in order, without gaps or "
                         f"overlap; got {blocks}")
    return blocks


def antithetic_halves(fitness: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean fitness of the + and - halves of the repeats, each of shape (D,)."""
    half = fitness.shape[0] // 2
    return fitness[:half].mean(0), fitness[half:].mean(0)
