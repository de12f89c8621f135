"""From a resolved config (and, optionally, the user's own model and task) to what the loop runs: the task,
the plain model, the perturbed model and the step object (ES or backprop)."""

import copy
import warnings
from typing import NamedTuple

import torch
from torch import nn

from ...conversion import convert
from ...distributed import Ranks
from ...layers import PerturbedModule
from ...model import PerturbedModel
from ...options import arguments, values
from ...population import Population
from ...strategies import STRATEGIES, Schedule, Strategy
from ...tasks import make_task
from ...tasks.protocol import ModelMaker, check_differentiable, check_task
from ...tasks.reward_tasks import HF, PretrainedGenerationTask, hf_directory
from ...tasks.rl_options import observation_statistics
from ..steps.activations import checkpoint_blocks
from ..steps.backprop import Backprop, BackpropStep, shard_model
from ..steps.evolution import AUTO, UNPROBED, EvolutionStep, Stepper
from .config import BACKPROP, TrainConfig, compiles
from .initialization import init_weights
from .memory_plan import MemoryPlan, check_fits, plan_run


class Built(NamedTuple):
    """What a run trains: its task, the plain model (evaluated and saved), the perturbed model (None for
    backprop) and the step object the loop drives."""

    task: object
    model: nn.Module
    pm: PerturbedModel | None
    step: Stepper



def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N; got {name!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested, but CUDA is not available")
    return device


def schedule(cfg: TrainConfig, name: str) -> Schedule | None:
    """The config's sigma or lr schedule (``name``), None when constant."""
    kind = getattr(cfg, f"{name}_schedule")
    return None if kind == "constant" else Schedule(kind, getattr(cfg, f"{name}_final"), cfg.steps)


def make_strategy(cfg: TrainConfig, pm: PerturbedModel) -> Strategy:
    """The config's strategy from the registry, with its options (``Strategy.Options``) and what it reads
    of the population (``Strategy.population_options``)."""
    cls = STRATEGIES[cfg.strategy]
    of_population = {name: getattr(pm, name) for name in cls.population_options}
    return cls(pm.directions, pm.antithetic, sigma_schedule=schedule(cfg, "sigma"), **of_population,
               **arguments(cfg.strategy_options))


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def planned(cfg: TrainConfig, task, device: torch.device, log) -> MemoryPlan | None:
    """An ES run of a model directory (hf:DIR): its memory plan, logged, and refused in one line where it cannot
    fit, before the weights are loaded. With a LoRA adapter (``--use-peft``, an adapter directory), the base model's
    weights and the adapter's evolving ones."""
    if cfg.strategy == BACKPROP or not str(cfg.model).startswith(HF):
        return None
    if isinstance(task, PretrainedGenerationTask):
        plan = plan_run(cfg, task.base, task, device, task.adapter_shapes())
    else:
        plan = plan_run(cfg, hf_directory(cfg.model), task, device)
    if plan is not None:
        log(plan.describe())
        check_fits(plan, device, f"--model {cfg.model} with --update {cfg.update}")
    return plan


def make_backprop(cfg: TrainConfig, task, model: nn.Module, ranks: Ranks | None = None) -> Backprop:
    """The optimizer side of a backprop run: activation checkpointing when asked, DistributedDataParallel
    under torchrun, the config's optimizer and lr schedule."""
    distributed = ranks is not None and ranks.distributed
    options = cfg.strategy_options
    if options.shard and not distributed:
        warnings.warn("--shard applies to torchrun jobs of several processes; this one process trains the whole "
                      "model", stacklevel=2)
    sharded = options.shard and distributed
    plain = copy.deepcopy(model) if sharded else None  # unsharded: what rank 0 evaluates and saves
    if options.activation_checkpointing:
        checkpoint_blocks(model)
    module = model
    if sharded:
        module = shard_model(model)
    elif distributed:
        from torch.nn.parallel import DistributedDataParallel

        module = DistributedDataParallel(model, device_ids=[model_device(model)] if task.device.type == "cuda"
                                         else None)
    return Backprop(model, options.optimizer, lr=cfg.lr, weight_decay=options.weight_decay,
                    lr_schedule=schedule(cfg, "lr"), module=module, plain=plain)


def config_task(cfg: TrainConfig, device: torch.device):
    """The built-in task a config names, with the config's values of the task's options."""
    backprop = cfg.strategy == BACKPROP
    normalize = backprop or observation_statistics(cfg.strategy, cfg.strategy_options)
    return make_task(cfg.task, device=device, seed=cfg.seed, normalize_observations=normalize, compile=compiles(cfg),
                     model=cfg.model, dtype=cfg.dtype, **values(cfg.task_options))


def initial_model(cfg: TrainConfig, task, model: nn.Module | None = None) -> nn.Module:
    """The run's model before training: the user's own (re-initialised only when ``cfg.init`` asks), or
    the task's, seeded, so that a run is a function of its config."""
    if model is not None and cfg.init == "default":
        return model
    if model is None and not isinstance(task, ModelMaker):
        raise TypeError(f"task {type(task).__name__} has no make_model: pass your model, train(cfg, model=..., "
                        f"task=...)")
    with torch.random.fork_rng(devices=[]):  # seeded initialisation that leaves the caller's RNG alone
        torch.manual_seed(cfg.seed)
        return init_weights(task.make_model(cfg.hidden, model=cfg.model) if model is None else model, cfg.init)


def perturbed(cfg: TrainConfig, model: nn.Module) -> nn.Module:
    """``model`` converted with the config's layer options; a model the user converted already is kept as
    it is (its kinds are its own)."""
    kinds = {m.kind.name for m in model.modules() if isinstance(m, PerturbedModule) and m.perturbs}
    if kinds:
        ignored = [f"layer {cfg.layer!r}"] if kinds != {cfg.layer} else []
        ignored += [f"layer options {cfg.layer_options}"] if cfg.layer_options else []
        ignored += [f"bits {cfg.bits}"] if cfg.bits is not None else []
        ignored += [f"evolve {cfg.evolve!r}"] if cfg.evolve != "all" else []
        if ignored:
            warnings.warn(f"the model is converted already (kinds {sorted(kinds)}) and keeps its own options, so "
                          f"these config values are ignored: {', '.join(ignored)}", stacklevel=3)
        return model
    return convert(model, cfg.layer, bits=cfg.bits, noise_on=cfg.noise_on, act_bits=cfg.act_bits, evolve=cfg.evolve,
                   **cfg.layer_options)


def held_in(model: nn.Module, dtype: str | None) -> nn.Module:
    """``model`` with its weights in ``dtype`` (None: as they are); below float32 the perturbed model keeps
    float32 masters and casts floating-point inputs to it."""
    return model if dtype is None else model.to(getattr(torch, dtype))


def check_own(cfg: TrainConfig, model: nn.Module | None, task) -> None:
    """A model and task of the user's own can train under ``cfg`` (a TypeError names what is missing):
    checked before a run touches its directory."""
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    if task is not None and cfg.strategy == BACKPROP:
        check_differentiable(task)
    elif task is not None:
        check_task(task)


def build(cfg: TrainConfig, device: torch.device, ranks: Ranks | None = None, model: nn.Module | None = None,
          task=None, log=print) -> Built:
    """Task, model, perturbed model and step object of a resolved config.

    ``task`` (any :class:`~nesgpu.tasks.protocol.Task`) and ``model`` (any nn.Module) replace the config's
    built-in ones. An ES run's model is converted to the perturbed kind; a backprop run's stays plain, and
    under torchrun (``ranks``) is called through DistributedDataParallel (or FSDP with ``cfg.shard``)."""
    ranks = ranks or Ranks()
    check_own(cfg, model, task)
    task = config_task(cfg, device) if task is None else check_task(task)
    plan = planned(cfg, task, device, log) if model is None else None
    model = initial_model(cfg, task, model)
    if cfg.strategy == BACKPROP:
        bp = make_backprop(cfg, check_differentiable(task), model.to(device), ranks)
        return Built(task, bp.plain, None, BackpropStep(task, bp, ranks, cfg.precision,
                                                                 cfg.strategy_options.accumulate))
    model = held_in(perturbed(cfg, model).to(device), cfg.dtype)
    start = UNPROBED if cfg.sigma == AUTO else cfg.sigma  # auto: the probe sets it before the first step
    in_place = cfg.update != "strategy"  # the update written into the weights: no masters, no .grad
    pm = PerturbedModel(model, cfg.directions, sigma=start, antithetic=cfg.antithetic, seed=cfg.seed,
                        masters=not in_place)
    population = Population(pm, ranks, cfg.chunk_size, cfg.precision, log, first_chunk=plan and plan.chunk)
    step = EvolutionStep(task, population, make_strategy(cfg, pm), cfg.sigma, lr=cfg.lr,
                         lr_schedule=schedule(cfg, "lr"), anchor=cfg.anchor, update=cfg.update)
    return Built(task, model, pm, step)


__all__ = ["Built", "build", "check_own", "make_strategy", "resolve_device"]
