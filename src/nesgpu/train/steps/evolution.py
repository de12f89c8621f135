"""One ES step, shown in order: ask, evaluate, tell, zero_grad, update, optimizer step, schedule.

:class:`EvolutionStep` and :class:`~nesgpu.train.steps.backprop.BackpropStep` have the same interface (the
:class:`Stepper` protocol), so the training loop runs either without knowing which.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch
from torch import nn

from ...population import Population
from ...strategies import Strategy
from ...strategies.base import fitness_statistics
from ...strategies.schedules import Schedule, StepSizes


class Stepper(Protocol):
    """What the training loop drives: one optimizer step per :meth:`run`, and the state to checkpoint."""

    model: nn.Module  # the plain model that is evaluated and saved
    chunk: int | None  # directions per block (None: not an ES run)
    needs_sync: bool  # whether evaluating or saving needs every process first (a sharded model)
    progress_key: str  # the statistic the progress line shows

    @property
    def step(self) -> int: ...  # completed steps

    def run(self) -> dict: ...  # one step; its statistics (the step's one read from the device)

    def sync(self) -> None: ...  # every process: gather what rank 0 evaluates and saves

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def apply_changes(self, old: dict, cfg) -> None: ...  # a resumed run's new sigma / lr

    def summary(self, cfg) -> dict: ...  # summary.json's layer, population and sigma (None: not ES)

    def finish(self) -> None: ...  # free what the steps held (noise)


class EvolutionStep:
    """Runs ES steps of ``strategy`` over ``population`` on ``task``; holds the strategy's state, the
    optimizer and its step sizes.

    Args:
        task: a :class:`~nesgpu.tasks.protocol.Task`.
        population: evaluates and updates the perturbed model.
        strategy: fitness in, weights and the next state out.
        optimizer: over ``population.parameters()`` (default: the strategy's own, at ``lr``).
        sigma: the initial noise scale.
        lr_schedule: the factor of every group's lr per step (None: constant).
    """

    needs_sync = False
    progress_key = "fitness_mean"

    def __init__(self, task, population: Population, strategy: Strategy, sigma: float,
                 optimizer: torch.optim.Optimizer | None = None, lr: float | None = None,
                 lr_schedule: Schedule | None = None):
        if strategy.directions != population.directions:
            raise ValueError(f"the strategy was built for {strategy.directions} directions; the population has "
                             f"{population.directions}")
        self.task, self.population, self.strategy = task, population, strategy
        self.model = population.pm.model
        self.optimizer = optimizer or strategy.make_optimizer(population.parameters(), lr)
        self.lrs = StepSizes(self.optimizer, lr_schedule)
        self.state = strategy.init(sigma)
        self.lrs.apply(self.state.step)

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def chunk(self) -> int:
        return self.population.chunk

    def run(self) -> dict:
        """One ES step; returns the fitness statistics, sigma, the next step's lr and the task's scalars. A step
        whose weights are all zero (every member tied: no signal) writes no ``.grad``, so the optimizer leaves
        the weights and its own state as they were."""
        strategy, state = self.strategy, self.state
        sigma = strategy.ask(state)
        result = self.population.evaluate(self.task, state.step + 1, sigma, sq_norms=strategy.needs_sq_norms)
        weights, told = strategy.tell(state, result.fitness, result.sq_norms)
        scalars = {k: v for k, v in result.info.items() if torch.as_tensor(v).dim() == 0}
        # a step whose weights are all zero (every member tied) changes no .grad: counted, in the step's one read
        scalars["no_signal"] = (weights == 0).all()
        stats = fitness_statistics(result.fitness, state.step + 1, strategy.antithetic, scalars)
        self.state = told
        self.optimizer.zero_grad(set_to_none=True)
        if not stats["no_signal"]:  # else no .grad at all: the optimizer skips the step (weight decay, momentum)
            self.population.update(weights, sigma)
            strategy.regularize(self.population.parameters())
        self.optimizer.step()
        self.population.pm.sync_weights()  # a half-precision model: its weights from the stepped masters
        self.lrs.apply(self.state.step)
        fitness = {k: stats.pop(k) for k in ("fitness_mean", "fitness_max", "fitness_min")}
        return {**fitness, "sigma": self.state.sigma, "lr": self.optimizer.param_groups[0]["lr"], **stats}

    def sync(self) -> None:
        """Every process holds the same model: nothing to gather."""

    def state_dict(self) -> dict:
        """The strategy's state, each group's base step size and the optimizer's state (the lr schedule is
        not stored: the one this step was built with applies from the loaded step on)."""
        masters = self.population.pm.master_state()  # a half-precision model's float32 weights
        return {**self.state.as_dict(), "lr": list(self.lrs.bases), "optimizer": self.optimizer.state_dict(),
                **({"masters": masters} if masters else {})}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; the saved base step sizes are set under this step's own schedule."""
        if not isinstance(state, dict) or "optimizer" not in state:
            raise ValueError("not an ES checkpoint's strategy state (no optimizer state)")
        self.state = self.strategy.State.from_dict(state)
        self.population.pm.load_master_state(state.get("masters"))
        self.optimizer.load_state_dict(state["optimizer"])
        legacy = state.get("lr_scheduler", {}).get("base_lrs")  # checkpoints of nesgpu 0.1.0 stored it
        self.lrs.load(state["lr"] if "lr" in state else legacy, self.state.step)

    def apply_changes(self, old: dict, cfg) -> None:
        """A resumed run's explicit new sigma replaces the current one; a new lr becomes the base."""
        if old.get("sigma") != cfg.sigma:
            self.state = dataclasses.replace(self.state, sigma=cfg.sigma, sigma0=cfg.sigma)
        if old.get("lr") != cfg.lr:
            self.lrs.set_base(cfg.lr, self.state.step)

    def summary(self, cfg) -> dict:
        """The run's layer kind, population (members, both signs), directions (PerturbedModel's: noise vectors,
        population / 2 with antithetic pairs) and (current) sigma, for summary.json."""
        return {"layer": cfg.layer, "population": cfg.population, "directions": cfg.directions,
                "sigma": self.state.sigma}

    def finish(self) -> None:
        self.population.free_memory()


__all__ = ["EvolutionStep", "Stepper"]
