"""The ask/tell shape that every strategy shares, over a PerturbedModel and a torch optimizer."""

from __future__ import annotations

import torch

from ..model import PerturbedModel
from .schedules import Schedule


def check_fitness(fitness: torch.Tensor, step: int, directions: int, antithetic: bool) -> torch.Tensor:
    """Validate a population's fitness of shape (R, D): finite, R even with antithetic sampling."""
    if not isinstance(fitness, torch.Tensor):
        raise TypeError(f"fitness must be a torch.Tensor of shape (R, {directions}); got {type(fitness).__name__}")
    if fitness.dim() == 1:
        fitness = fitness.unsqueeze(0)
    if fitness.dim() != 2 or fitness.shape[1] != directions:
        raise ValueError(f"fitness must have shape (R, {directions}) or ({directions},); got {tuple(fitness.shape)}")
    if antithetic and fitness.shape[0] % 2:
        raise ValueError(f"antithetic fitness needs an even number of repeats; got shape {tuple(fitness.shape)}")
    if not torch.isfinite(fitness).all():  # reading fitness is the one host sync a step allows
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
    def ask(self) -> None:
        """Set sigma for this step and draw its noise (noise step = completed steps + 1)."""
        if self.sigma_schedule is not None:
            self.pm.sigma = self.sigma0 * self.sigma_schedule(self.step)
        self.pm.set_noise(step=self.step + 1)

    def tell(self, fitness: torch.Tensor) -> dict[str, float]:
        """Turn fitness into an update, step the optimizer, and return the step's statistics."""
        fitness = check_fitness(fitness, self.step + 1, self.pm.directions, self.pm.antithetic)
        weights = self.weights(fitness)
        self.optimizer.zero_grad(set_to_none=True)
        self.pm.update(weights)
        self.before_optimizer_step()
        self.optimizer.step()
        self.after_optimizer_step(fitness)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.step += 1
        stats = torch.stack([fitness.mean(), fitness.max(), fitness.min()]).tolist()
        return {"fitness_mean": stats[0], "fitness_max": stats[1], "fitness_min": stats[2],
                "sigma": self.pm.sigma, "lr": self.optimizer.param_groups[0]["lr"]}

    # ----- what a strategy defines -------------------------------------------------------------------
    def weights(self, fitness: torch.Tensor) -> torch.Tensor:
        """Weights for ``pm.update`` (lower is better there), of shape (R, D) or (D,)."""
        raise NotImplementedError

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
