"""The ask/tell shape that every strategy shares, over a PerturbedModel and a torch optimizer."""

from __future__ import annotations

import torch

from ..model import PerturbedModel, direction_blocks
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

    Fitness is higher-is-better, of shape (R, D) as laid out by the population input.

    Args:
        pm: the perturbed model.
        optimizer: any torch optimizer over the model's parameters.
        sigma_schedule, lr_schedule: factors of the initial sigma / lr per step (default constant).
    """

    name = "strategy"
    normalize_observations = True  # RL tasks keep running observation statistics unless told otherwise

    def __init__(self, pm: PerturbedModel, optimizer: torch.optim.Optimizer,
                 sigma_schedule: Schedule | None = None, lr_schedule: Schedule | None = None,
                 chunk_size: int | None = None):
        if not isinstance(pm, PerturbedModel):
            raise TypeError(f"pm must be a PerturbedModel; got {type(pm).__name__}")
        if chunk_size is not None and not 1 <= chunk_size <= pm.directions:
            raise ValueError(f"chunk_size must be in [1, {pm.directions}]; got {chunk_size}")
        self.pm = pm
        self.optimizer = optimizer
        self.chunk_size = chunk_size
        self.step = 0  # completed tells
        self.sigma0 = pm.sigma
        self.sigma_schedule = sigma_schedule
        self.lr_scheduler = None if lr_schedule is None else torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule)

    # ----- the loop ----------------------------------------------------------------------------------
    def chunks(self) -> list[range]:
        """Blocks of directions the update runs over (one block unless ``chunk_size`` is set)."""
        return direction_blocks(range(self.pm.directions), self.chunk_size)

    def ask(self) -> None:
        """Set sigma for this step and, unless chunked, draw its noise (noise step = completed steps + 1).

        Chunked callers draw each block with ``pm.set_noise(step, directions=block)`` as they evaluate it.
        """
        if self.sigma_schedule is not None:
            self.pm.sigma = self.sigma0 * self.sigma_schedule(self.step)
        if self.chunk_size is None:
            self.pm.set_noise(step=self.step + 1)

    def tell(self, fitness: torch.Tensor, extra: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Turn fitness into an update, step the optimizer, and return the step's statistics.

        ``extra`` scalars (e.g. a training loss) are read back together with the fitness statistics: one
        host read per step, which also checks that the fitness is finite.
        """
        step = self.step + 1
        fitness = check_fitness(fitness, step, self.pm.directions, self.pm.antithetic, read=False)
        extra = extra or {}
        values = torch.stack([torch.isfinite(fitness).all().to(fitness.dtype), fitness.mean(), fitness.max(),
                              fitness.min(), *(torch.as_tensor(v, dtype=fitness.dtype, device=fitness.device)
                                               for v in extra.values())]).tolist()
        if not values[0]:
            check_fitness(fitness, step, self.pm.directions, self.pm.antithetic)  # raises, naming the member
        weights = self.weights(fitness)
        self.optimizer.zero_grad(set_to_none=True)
        for block in self.chunks():
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
    def state_dict(self) -> dict:
        state = {"step": self.step, "sigma": self.pm.sigma, "sigma0": self.sigma0,
                 "optimizer": self.optimizer.state_dict()}
        if self.lr_scheduler is not None:
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
        return state

    def set_lr(self, lr: float) -> None:
        """A new base step size from the current step on (a schedule keeps scaling it). An optimizer whose
        groups carry a ``max_speed`` (ClipUp: twice the step size) has it scaled by the same factor."""
        for group in self.optimizer.param_groups:
            if "max_speed" in group:
                base = group.get("initial_lr", group["lr"])
                group["max_speed"] = group["max_speed"] * lr / base
        if self.lr_scheduler is None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            return
        sched = self.lr_scheduler
        sched.base_lrs = [lr] * len(sched.base_lrs)
        for group, factor in zip(self.optimizer.param_groups, sched.lr_lambdas):
            group["initial_lr"] = lr
            group["lr"] = lr * factor(sched.last_epoch)

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.pm.sigma = float(state["sigma"])
        self.sigma0 = float(state["sigma0"])
        self.pm.step = self.step
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])


def antithetic_halves(fitness: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean fitness of the + and - halves of the repeats, each of shape (D,)."""
    half = fitness.shape[0] // 2
    return fitness[:half].mean(0), fitness[half:].mean(0)
