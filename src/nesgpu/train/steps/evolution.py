"""One ES step, shown in order: ask, evaluate, tell, zero_grad, update, optimizer step, schedule.

:class:`EvolutionStep` and :class:`~nesgpu.train.steps.backprop.BackpropStep` have the same interface (the
:class:`Stepper` protocol), so the training loop runs either without knowing which.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Protocol

import torch
from torch import nn

from ...inplace import IN_PLACE, UPDATES
from ...model import MAX_SIGMA, MIN_SIGMA
from ...population import Population
from ...probe import Probe, probe_line, probe_sigma
from ...strategies import Strategy
from ...strategies.base import fitness_statistics
from ...strategies.schedules import Schedule, StepSizes
from .distribution import distribution_for
from ..setup.old_runs import saved_step_sizes
from ...tasks.protocol import ComparesToStart
from .anchor import StartingWeights

AUTO = "auto"
UNPROBED = 0.01  # the sigma a run of --sigma auto holds until the probe has run (it never steps at it)


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
        sigma: the initial noise scale, or ``"auto"``: probed before the first step of a new run
            (:func:`nesgpu.probe.probe_sigma`; a resumed run keeps the sigma of its checkpoint).
        lr: the optimizer's step size, or ``"auto"``: the strategy's rule from sigma
            (:meth:`~nesgpu.strategies.Strategy.lr_for_sigma`).
        lr_schedule: the factor of every group's lr per step (None: constant).
        update: "strategy" (its optimizer over ``.grad``), or "sgd" / "adam": the update written into the weights
            by :class:`~nesgpu.inplace.InPlaceSGD` / :class:`~nesgpu.inplace.InPlaceAdam`
            (:meth:`~nesgpu.population.Population.apply`: no ``.grad``, no masters; ``lr="auto"`` its own rule).
        anchor: after each step, pull the weights this share of the way back to the starting ones (0: off).
            The starting weights (:class:`~nesgpu.train.steps.anchor.StartingWeights`) are kept for it, and for
            a task that measures from them (:class:`~nesgpu.tasks.protocol.ComparesToStart`).
    """

    needs_sync = False
    progress_key = "fitness_mean"

    def __init__(self, task, population: Population, strategy: Strategy, sigma: float | str,
                 optimizer: torch.optim.Optimizer | None = None, lr: float | str | None = None,
                 lr_schedule: Schedule | None = None, anchor: float = 0.0, update: str = "strategy"):
        if strategy.directions != population.directions:
            raise ValueError(f"the strategy was built for {strategy.directions} directions; the population has "
                             f"{population.directions}")
        self.task, self.population, self.strategy = task, population, strategy
        self.model = population.pm.model
        self.probe: Probe | None = None  # what --sigma auto measured
        self.probing, self.auto_lr = sigma == AUTO, lr == AUTO
        start = UNPROBED if self.probing else sigma
        in_place = check_update(update, strategy, optimizer)
        self.in_place = in_place is not None
        self.lr_rule = (lambda s: in_place.lr_for_sigma(s, population.directions)) if in_place else \
            strategy.lr_for_sigma
        lr = self.lr_rule(start) if self.auto_lr else lr
        if in_place:
            self.optimizer = in_place(population.parameters(), strategy.default_lr if lr is None else lr,
                                      l2=strategy.l2)
        else:
            self.optimizer = optimizer or strategy.make_optimizer(population.parameters(), lr)
        self.lrs = StepSizes(self.optimizer, lr_schedule)
        self.state = strategy.init(start)
        self.lrs.apply(self.state.step)
        self.distribution = distribution_for(strategy, population)  # sigma alone, per parameter, or a covariance
        self.floored = False  # whether sigma reached MIN_SIGMA (warned once)
        self.anchor = float(anchor)
        self.compares = isinstance(task, ComparesToStart) and task.wants_start  # kl, drift
        self.start = StartingWeights(self.model, population.parameters()) if self.anchor or self.compares else None
        if self.compares:
            task.compare_to(self.start)
        self.distribution.start()  # S = 1 or A = I, then adapted every step
        population.pm.set_subspace(strategy.subspace)  # a random subset of the modules per step (1: all)

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
        if self.probing:
            self.probed(probe_sigma(self.population, self.task))
        strategy, state = self.strategy, self.state
        sigma = strategy.ask(state)
        result = self.population.evaluate(self.task, state.step + 1, sigma, sq_norms=strategy.needs_sq_norms)
        weights, told = strategy.tell(state, result.fitness, result.sq_norms)
        scalars = {k: v for k, v in result.info.items() if torch.as_tensor(v).dim() == 0}
        # a step whose weights are all zero (every member tied) changes no .grad: counted, in the step's one read
        scalars["no_signal"] = (weights == 0).all()
        if self.distribution.adapts:
            scalars["sigma_scale"] = self.distribution.mean_scale()
        stats = fitness_statistics(result.fitness, state.step + 1, strategy.antithetic, scalars,
                                   strategy.divergence_hint)
        self.state = told
        self.optimizer.zero_grad(set_to_none=True)
        if not stats["no_signal"]:  # else no .grad at all: the optimizer skips the step (weight decay, momentum)
            self._update(weights, sigma, state, result.fitness)
            if not self.in_place:  # an L2 term on .grad (an in-place step adds strategy.l2 itself)
                strategy.regularize(self.population.parameters())
        self.optimizer.step()
        if self.anchor:
            self.start.pull(self.anchor)
        self.population.pm.sync_weights()  # a half-precision model: its weights from the stepped masters
        self._hold_sigma_at_the_floor()
        self.lrs.apply(self.state.step)
        fitness = {k: stats.pop(k) for k in ("fitness_mean", "fitness_max", "fitness_min")}
        if self.strategy.subspace < 1:  # counted on the host
            stats["subspace_share"] = self.population.pm.subspace_share(state.step + 1)
        return {**fitness, "sigma": self.state.sigma, "lr": self.optimizer.param_groups[0]["lr"], **stats}

    def _hold_sigma_at_the_floor(self) -> None:
        """A strategy that adapts sigma and has converged takes it below what the noise can resolve: it stays at
        :data:`~nesgpu.model.MIN_SIGMA` from then on, with one warning (not an error at the next step)."""
        sigma = self.state.sigma
        if not sigma <= MAX_SIGMA:  # also NaN: a checkpoint of it could not be resumed
            raise ValueError(f"strategy {self.strategy.name!r} made sigma {sigma:.4g} at step {self.state.step} (at "
                             f"most {MAX_SIGMA:g} holds); check the task's fitness (lower --sigma or --lr)")
        if sigma < MIN_SIGMA:
            self.state = dataclasses.replace(self.state, sigma=MIN_SIGMA)
            if not self.floored:
                self.floored = True
                warnings.warn(f"{self.strategy.name} took sigma to {sigma:.3g} at step {self.state.step}: the search "
                              f"has converged as far as noise can resolve; sigma stays at {MIN_SIGMA:g}", stacklevel=3)

    def _update(self, weights: torch.Tensor, sigma: float, state, fitness: torch.Tensor) -> None:
        """The population's update into ``.grad`` (or, in place, into the weights); a strategy with a sigma per
        parameter or a covariance also takes its new scales or factor from the statistics the same pass sums (no
        host read)."""
        if self.in_place:
            self.population.apply(weights, sigma, self.optimizer)
            return
        self.state = self.distribution.update(weights, sigma, state, self.state, fitness)

    @property
    def columns(self) -> tuple[str, ...]:
        """The statistics of its own a step logs beside the fitness: a strategy with a sigma per parameter logs
        the mean scale (``sigma_scale``), one with a subspace the share of the parameters it perturbed
        (``subspace_share``)."""
        return ("sigma_scale",) * self.distribution.adapts + ("subspace_share",) * (self.strategy.subspace < 1)

    def probed(self, probe: Probe) -> None:
        """Take the probe's sigma (and, with ``lr="auto"``, its step size) from this step on."""
        self.probing, self.probe = False, probe
        self.state = dataclasses.replace(self.state, sigma=probe.sigma, sigma0=probe.sigma)
        if self.auto_lr:
            self.lrs.set_base(self.lr_rule(probe.sigma), self.state.step)
        self.population.log(probe_line(probe) + f"; lr {self.lrs.bases[0]:.3g}"
                            + (" (auto: from sigma)" if self.auto_lr else ""))

    def sync(self) -> None:
        """Every process holds the same model: nothing to gather."""

    def state_dict(self) -> dict:
        """The strategy's state, each group's base step size and the optimizer's state (the lr schedule is
        not stored: the one this step was built with applies from the loaded step on)."""
        masters = self.population.pm.master_state()  # a half-precision model's float32 weights
        return {**self.state.as_dict(), "lr": list(self.lrs.bases), "optimizer": self.optimizer.state_dict(),
                **({"masters": masters} if masters else {}), **self.distribution.state_dict(),
                **(self.start.state() if self.start else {}),
                **({"probe": self.probe.as_dict()} if self.probe is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; the saved base step sizes are set under this step's own schedule."""
        if not isinstance(state, dict) or "optimizer" not in state:
            raise ValueError("not an ES checkpoint's strategy state (no optimizer state)")
        self.state = self.strategy.load_state(state)  # checked: a tampered checkpoint never reaches a step
        self.probing = False  # a resumed run keeps its sigma (and what the probe measured, if it ran)
        self.probe = Probe.from_dict(state["probe"]) if isinstance(state.get("probe"), dict) else None
        self.population.pm.load_master_state(state.get("masters"))
        self.distribution.load_state_dict(state)
        self._load_start(state)
        self.optimizer.load_state_dict(state["optimizer"])  # an in-place one keeps the run's L2 (InPlace)
        self.lrs.load(saved_step_sizes(state, self.optimizer), self.state.step)

    def _load_start(self, state: dict) -> None:
        """The starting weights of the run the checkpoint continues; refused for --anchor where it kept none (a
        run started without it); else a warning that the model as built here stands in for them."""
        if self.start is None or self.start.load(state):
            return
        if self.anchor:
            raise ValueError("--anchor pulls toward the starting weights, which this checkpoint does not hold (the "
                             "run started without --anchor); drop --anchor, or start a new run with it")
        warnings.warn("the checkpoint holds no starting weights (the run started without kl and without a drift "
                      "text, or under a nesgpu that did not keep them): kl and the change of drift_nll are measured "
                      "from the model as this run builds it (the run's own start where --model and --seed are "
                      "unchanged)", stacklevel=3)

    def apply_changes(self, old: dict, cfg) -> None:
        """A resumed run's explicit new sigma replaces the current one; a new lr becomes the base (``"auto"``:
        the strategy's rule from the run's sigma). ``--sigma auto`` on resume keeps the checkpoint's sigma: the
        probe runs before a new run's first step only (a warning says so where the run had another sigma)."""
        sigma_changed = old.get("sigma") != cfg.sigma
        if sigma_changed and cfg.sigma == AUTO:
            warnings.warn(f"--sigma auto does not probe a resumed run: it keeps its sigma {self.state.sigma:.4g}; "
                          f"give a number to change it", stacklevel=2)
        elif sigma_changed:
            self.state = dataclasses.replace(self.state, sigma=cfg.sigma, sigma0=cfg.sigma)
        if old.get("lr") != cfg.lr or (cfg.lr == AUTO and sigma_changed and cfg.sigma != AUTO):
            lr = self.lr_rule(self.state.sigma) if cfg.lr == AUTO else cfg.lr
            self.lrs.set_base(lr, self.state.step)

    def summary(self, cfg) -> dict:
        """The run's layer kind, population (members, both signs), directions (PerturbedModel's: noise vectors,
        population / 2 with antithetic pairs) and (current) sigma, for summary.json."""
        return {"layer": cfg.layer, "population": cfg.population, "directions": cfg.directions,
                "sigma": self.state.sigma, "lr": self.lrs.bases[0],
                **({"sigma_probe": self.probe.as_dict()} if self.probe is not None else {})}

    def finish(self) -> None:
        """Free the noise, and take the starting weights back from the task (a task object used again after the
        run measures from nothing of this run's)."""
        self.population.free_memory()
        if self.compares:
            self.task.compare_to(None)


def check_update(update: str, strategy: Strategy, optimizer) -> type | None:
    """The in-place optimizer class of ``update`` (None: "strategy", the optimizer over ``.grad``); a ValueError for
    another name, a caller's optimizer beside an in-place step, or a strategy that adapts its noise."""
    if update == "strategy":
        return None
    if update not in IN_PLACE:
        raise ValueError(f"update must be one of {UPDATES}; got {update!r}")
    if optimizer is not None:
        raise ValueError(f"update={update!r} steps in place by its own optimizer; pass no optimizer")
    if strategy.adapts_scales or strategy.adapts_covariance:
        raise ValueError(f"update={update!r} writes the plain ES estimate into the weights; strategy "
                         f"{strategy.name!r} adapts its noise from the update's pass (use update='strategy')")
    return IN_PLACE[update]


__all__ = ["EvolutionStep", "Stepper"]
