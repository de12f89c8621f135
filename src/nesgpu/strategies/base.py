"""The ask/tell shape every strategy shares (evosax's): an explicit state in, fitness in, weights and the next
state out. A strategy knows nothing of the model, the noise or the blocks of directions: the population
(:class:`nesgpu.population.Population`) evaluates and updates, the optimizer steps.

One step, as the training loop runs it::

    sigma = strategy.ask(state)                                # the step's noise scale
    result = population.evaluate(task, state.step + 1, sigma)  # fitness (R, D), ||z_d||^2, statistics
    weights, state = strategy.tell(state, result.fitness, result.sq_norms)  # fitness: higher is better
    optimizer.zero_grad(); population.update(weights, sigma)   # weights: lower is better; .grad = the ES estimate
    strategy.regularize(population.parameters()); optimizer.step()
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..options import NoOptions
from .checkpoint import no_paths, refusal
from .schedules import Schedule

# the noise scales a checkpoint's state may hold: nesgpu.model's bounds (MIN_SIGMA, MAX_SIGMA), restated here
# since a strategy knows nothing of the model; above the largest, sigma^2 overflows float32
SIGMA_RANGE = (1e-12, 1e18)
DIVERGED = "check the task or lower sigma / lr"  # what a non-finite fitness points to by default
# option subspace's doc: each step perturbs and updates a random subset of the modules (nesgpu.layers.subspace)
SUBSPACE_HELP = "share of parameters evolved per step"


@dataclass(frozen=True)
class StrategyState:
    """What a strategy carries from one step to the next; checkpointed field by field (:meth:`as_dict`). A
    strategy with more to carry (a per-layer sigma, a fitness baseline) declares a subclass with more fields
    as its :attr:`Strategy.State`; a field with a default loads from a checkpoint written before it existed.

    Attributes:
        step: completed steps.
        sigma: the noise scale of the last step (PGPE: the adapted one, which the next step uses).
        sigma0: the initial sigma, which a sigma schedule scales.
    """

    step: int
    sigma: float
    sigma0: float

    def as_dict(self) -> dict:
        """Every field by name (tensors as they are: a checkpoint stores them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict) -> StrategyState:
        """A state from :meth:`as_dict` (extra keys, such as a checkpoint's optimizer state, are ignored; a
        field missing there takes its default)."""
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.name not in values and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"strategy state has no {missing[0]!r}; expected {', '.join(f.name for f in fields)} "
                             f"({cls.__name__})")
        casts = {"int": int, "float": float}  # the annotations, as strings (postponed evaluation)
        return cls(**{f.name: casts.get(f.type, lambda v: v)(values[f.name]) for f in fields if f.name in values})


def check_fitness(fitness: torch.Tensor, step: int, directions: int, antithetic: bool, read: bool = True,
                  hint: str = DIVERGED) -> torch.Tensor:
    """Validate a population's fitness of shape (R, D): R even with antithetic sampling, and (when ``read``)
    finite, which reads it back from the device; ``hint``: what the error of a non-finite one points to (a
    strategy's :attr:`Strategy.divergence_hint`)."""
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
                         f"direction {d}); {hint}")
    return fitness


def fitness_statistics(fitness: torch.Tensor, step: int, antithetic: bool,
                       extra: dict[str, torch.Tensor] | None = None, hint: str = DIVERGED) -> dict[str, float]:
    """Mean, max and min of a step's fitness and the ``extra`` scalars, in one host read (the step's one),
    which also checks that the fitness is finite (a ValueError names the first bad member and ends with
    ``hint``)."""
    extra = extra or {}
    fitness = check_fitness(fitness, step, fitness.shape[-1], antithetic, read=False)
    values = torch.stack([torch.isfinite(fitness).all().to(fitness.dtype), fitness.mean(), fitness.max(),
                          fitness.min(), *(torch.as_tensor(v, dtype=fitness.dtype, device=fitness.device)
                                           for v in extra.values())]).tolist()
    if not values[0]:
        check_fitness(fitness, step, fitness.shape[-1], antithetic, hint=hint)  # raises, naming the member
    stats = {"fitness_mean": values[1], "fitness_max": values[2], "fitness_min": values[3]}
    stats.update(zip(extra, values[4:]))
    return stats


class Strategy:
    """Fitness in (higher is better, shape (R, D)), weights for the population's update out (lower is better
    there, shape (R, D) or (D,)), over an explicit :class:`StrategyState`.

    Args:
        directions: D, the population's noise directions.
        antithetic: whether the population evaluates each direction with both signs.
        sigma_schedule: the factor of the initial sigma per step (default constant).
    """

    name = "strategy"
    default_lr: ClassVar[float] = 0.01  # the step size its default optimizer expects
    needs_antithetic: ClassVar[bool] = False  # the one place this rule is stated, per strategy
    # whether a run of it samples antithetic pairs unless told otherwise (CMA-ES: independent members)
    default_antithetic: ClassVar[bool] = True
    needs_sq_norms: ClassVar[bool] = False  # whether tell reads ||z_d||^2 (evaluated with the fitness)
    # what the trainer passes from the perturbed model, by its attribute names (PGPE: num_perturbed)
    population_options: ClassVar[tuple[str, ...]] = ()
    adapts_sigma: ClassVar[bool] = False  # sigma follows the strategy's own rule, so no sigma schedule applies
    # a sigma per parameter (SNES, CEM, sep-CMA-ES): the population's scales S, adapted by scale_weights and adapt;
    # needs_means: adapt reads sum_d w_d z_d too (CMA-ES's evolution paths)
    adapts_scales: ClassVar[bool] = False
    needs_means: ClassVar[bool] = False
    # its scale updates are multiplicative in the statistic, so they keep an outer-product scale (low-rank noise's)
    outer_scales: ClassVar[bool] = False
    # a full covariance (CMA-ES, xNES): the population's covariance factor A, adapted by adapt_covariance from
    # CMA-ES's statistics, or with natural_statistics xNES's (PerturbedModel.natural_statistics)
    adapts_covariance: ClassVar[bool] = False
    natural_statistics: ClassVar[bool] = False
    max_parameters: ClassVar[int | None] = None  # the most evolving parameters it takes (None: no limit)
    # its options: a frozen dataclass (see nesgpu.options) whose fields the constructor takes and the training
    # configuration offers as options of their own (--top-b); the instance keeps them as ``self.options``
    Options: ClassVar[type] = NoOptions
    State: ClassVar[type[StrategyState]] = StrategyState  # what it carries between steps (see StrategyState)

    @classmethod
    def scales_with(cls, options) -> bool:
        """Whether it adapts a sigma per parameter with ``options`` (its :attr:`Options`)."""
        return cls.adapts_scales

    @classmethod
    def check_options(cls, options, directions: int) -> None:
        """Raise ValueError if ``options`` (already valid on their own) do not fit ``directions``."""

    def __init__(self, directions: int, antithetic: bool = True, sigma_schedule: Schedule | None = None):
        if isinstance(directions, bool) or not isinstance(directions, int) or directions < 1:
            raise ValueError(f"directions must be a positive int; got {directions!r}")
        if self.needs_antithetic and not antithetic:
            raise ValueError(f"{type(self).__name__} needs antithetic (symmetric) sampling: antithetic=True")
        self.directions = directions
        self.antithetic = bool(antithetic)
        self.sigma_schedule = sigma_schedule
        self.options = self.Options()  # a strategy with options sets its own

    def init(self, sigma: float) -> StrategyState:
        """The state before the first step."""
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0 < sigma < math.inf:
            raise ValueError(f"sigma must be a positive finite number; got {sigma!r}")
        return self.State(step=0, sigma=float(sigma), sigma0=float(sigma), **self.initial_state())

    def initial_state(self) -> dict:
        """The values of the fields :attr:`State` adds to :class:`StrategyState`, before the first step."""
        return {}

    def load_state(self, values: dict) -> StrategyState:
        """The state a checkpoint holds: ``values`` has :meth:`StrategyState.as_dict`'s fields beside the
        trainer's entries (``covariance``, ``paths``, ``scales``). Its step and sigma are checked here, the rest
        by :meth:`check_state`: a damaged or tampered checkpoint is a ValueError naming the strategy, the entry
        and what was expected, before any step reads it."""
        if not isinstance(values, dict):
            raise ValueError(f"a strategy state is a dict of its fields; got {type(values).__name__}")
        step = values.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise refusal(self.name, "step", f"is {step!r}", "a count of steps, an int >= 0")
        low, high = SIGMA_RANGE
        for name in ("sigma", "sigma0"):
            value = values.get(name, low)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise refusal(self.name, name, f"is {value!r}", f"a noise scale in [{low:g}, {high:g}]")
        state = self.State.from_dict(values)
        self.check_state(state, values)
        return state

    def check_state(self, state: StrategyState, values: dict) -> None:
        """Check what a checkpoint holds beside ``state`` (``values``, as :meth:`load_state` takes them): a
        strategy that keeps evolution paths or a covariance checks them; by default it holds no paths."""
        no_paths(self.name, values)

    @property
    def divergence_hint(self) -> str:
        """What the error of a non-finite fitness points to (a strategy with a step size of its own given names
        it too)."""
        return DIVERGED

    def make_optimizer(self, parameters, lr: float | None = None) -> torch.optim.Optimizer:
        """This strategy's default optimizer over ``parameters`` (step size ``lr``, default :attr:`default_lr`)."""
        raise NotImplementedError

    @classmethod
    def lr_for_sigma(cls, sigma: float) -> float:
        """The step size of its default optimizer that goes with ``sigma`` (``--lr auto``): a strategy without a
        rule of its own keeps its :attr:`default_lr`."""
        return cls.default_lr

    def ask(self, state: StrategyState) -> float:
        """The sigma of the coming step: the schedule's at this step, else the state's."""
        if self.sigma_schedule is None:
            return state.sigma
        return state.sigma0 * self.sigma_schedule(state.step)

    def tell(self, state: StrategyState, fitness: torch.Tensor, sq_norms: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, StrategyState]:
        """Weights for ``population.update`` and the state after this step. ``fitness`` (R, D) is higher-is-
        better (a return, minus a loss); the weights are lower-is-better, as ``pm.update(losses)`` takes them.
        ``sq_norms`` (D,) is ||z_d||^2, which only strategies with :attr:`needs_sq_norms` read."""
        fitness = self.check(fitness, state)
        return self.weights(fitness, self.ask(state)), self.advance(state)

    def adapt(self, state: StrategyState, scales: dict, seconds: dict, means: dict, paths: dict
              ) -> tuple[dict, dict, StrategyState]:
        """A strategy with a sigma per parameter: the new scales, its per-parameter state (``paths``) and its
        state, from the step's statistics by parameter name: ``seconds`` sum_d w_d (z_d o z_d - 1), ``means``
        sum_d w_d z_d (with :attr:`needs_means`). By default each scale by :meth:`rescale`."""
        return {name: self.rescale(scales[name], value) for name, value in seconds.items()}, paths, state

    def rescale(self, scale: torch.Tensor, statistic: torch.Tensor) -> torch.Tensor:
        """The new scale of one parameter from its statistic sum_d w_d (z_d o z_d - 1) (see :meth:`adapt`)."""
        raise NotImplementedError

    def regularize(self, parameters) -> None:
        """Called with the parameters after the update wrote ``.grad`` (e.g. OpenAI-ES's L2 decay): none."""

    @property
    def l2(self) -> float:
        """The L2 coefficient :meth:`regularize` adds to the gradient (an in-place update applies it itself)."""
        return 0.0

    @property
    def subspace(self) -> float:
        """The share of the perturbed parameters each step perturbs and updates (option ``subspace`` of the
        strategies that take it; 1: all)."""
        return getattr(self.options, "subspace", 1.0)

    # ----- what a strategy builds on -----------------------------------------------------------------
    def weights(self, fitness: torch.Tensor, sigma: float) -> torch.Tensor:
        """The update's weights of a checked fitness at the step's ``sigma``: what a strategy whose state
        holds nothing more than step and sigma defines (one with more overrides :meth:`tell`)."""
        raise NotImplementedError

    def check(self, fitness: torch.Tensor, state: StrategyState) -> torch.Tensor:
        return check_fitness(fitness, state.step + 1, self.directions, self.antithetic, read=False)

    def advance(self, state: StrategyState, sigma: float | None = None) -> StrategyState:
        """The state one step on, with ``sigma`` (default: the step's own, :meth:`ask`)."""
        return dataclasses.replace(state, step=state.step + 1, sigma=self.ask(state) if sigma is None else sigma)


def antithetic_halves(fitness: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean fitness of the + and - halves of the repeats, each of shape (D,)."""
    half = fitness.shape[0] // 2
    return fitness[:half].mean(0), fitness[half:].mean(0)
