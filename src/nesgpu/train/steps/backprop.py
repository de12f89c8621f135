"""The gradient baseline: the same model, task, data and run files as an ES run, trained by autograd.

``--strategy backprop`` swaps the ES step for :class:`BackpropStep`: every step draws the task's minibatch
(micro-batch i of step t is the task's batch of "step" (t - 1) * accumulate + i + 1, so with one micro-batch
it is exactly the batch the ES run sees at step t), runs forward and backward under optional autocast, and
steps a torch optimizer (AdamW by default). :class:`Backprop` holds the optimizer, the step counter and the
lr schedule, shaped like an ES strategy for the trainer (``step``, ``optimizer``, ``state_dict``).

The efficient-training techniques that belong to gradient training:

- mixed precision: ``precision`` bf16 or fp16 under ``torch.autocast``; fp16 with ``torch.amp.GradScaler``
  (its state is part of the checkpoint);
- gradient accumulation: ``accumulate`` micro-batches per optimizer step, each ``batch_size`` samples;
- activation checkpointing (:func:`nesgpu.train.steps.activations.checkpoint_blocks`);
- under torchrun: DistributedDataParallel, each process a slice of every micro-batch; or with ``shard``,
  FSDP2's ``fully_shard`` (ZeRO-3: parameters, gradients and optimizer state split over the processes), for
  models whose training state does not fit one device. A plain copy of the model on rank 0 is refreshed
  from the shards (a collective of every rank) at the steps that evaluate or checkpoint.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from ...distributed import Ranks
from ...options import check_options, option
from ...precision import autocast_dtype
from ...strategies import Schedule
from ...strategies.schedules import StepSizes
from .activations import TRANSFORMER_LAYERS, inside_transformer_layer

# torch.optim's optimizers by lower-case name, less those a plain step cannot drive: LBFGS needs a closure,
# SparseAdam sparse gradients, Muon 2-D parameters only
_UNSUITED = ("lbfgs", "sparseadam", "muon")
_OPTIMIZERS = {name.lower(): cls for name, cls in vars(torch.optim).items()
               if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
               and name.lower() not in _UNSUITED}


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """A torch.optim optimizer class by its name, in any case ("adamw", "SGD")."""
    if not isinstance(name, str) or name.lower() not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of torch.optim's {sorted(_OPTIMIZERS)}; got {name!r}")
    return _OPTIMIZERS[name.lower()]


@dataclass(frozen=True)
class BackpropOptions:
    """The options of ``--strategy backprop`` (the configuration offers each as an option of its own)."""

    optimizer: str = option("adamw", "a torch.optim optimizer by name (adamw, adam, sgd, ...)", defines=True)
    weight_decay: float = option(0.01, "the optimizer's weight decay (its own decoupled or L2 form)", at_least=0)
    accumulate: int = option(1, "micro-batches of batch_size per step, their gradients accumulated", at_least=1)
    activation_checkpointing: bool = option(False, "recompute each block's activations in the backward pass "
                                                   "instead of storing them (torch.utils.checkpoint)")
    shard: bool = option(False, "under torchrun: shard parameters, gradients and optimizer state over the "
                                "processes (FSDP2 fully_shard, ZeRO-3) instead of replicating them (DDP)",
                         defines=True)

    def __post_init__(self):
        check_options(self, "backprop")
        optimizer_class(self.optimizer)  # names the optimizers when unknown


class Backprop:
    """Optimizer, step counter and lr schedule of a backprop run.

    Args:
        model: the plain model, whose parameters train.
        optimizer: a torch.optim name (see :func:`optimizer_class`).
        lr, weight_decay: the optimizer's step size and weight decay (its own decoupled or L2 form).
        lr_schedule: the factor of lr per step (None: constant).
        module: what a step calls (the DistributedDataParallel wrapper of ``model`` under torchrun; default
            ``model``).
        plain: under sharding, the unsharded copy that rank 0 evaluates and saves (see :meth:`sync`).
    """

    name = "backprop"

    def __init__(self, model: nn.Module, optimizer: str = "adamw", lr: float = 1e-3, weight_decay: float = 0.01,
                 lr_schedule: Schedule | None = None, module: nn.Module | None = None,
                 plain: nn.Module | None = None):
        cls = optimizer_class(optimizer)
        self.module = model if module is None else module
        self.sharded = plain is not None
        self.plain = model if plain is None else plain  # what is evaluated and saved
        self._full_optimizer_state: dict | None = None  # under sharding: gathered by sync
        try:
            self.optimizer = cls(model.parameters(), lr=lr, weight_decay=weight_decay)
        except TypeError as e:  # an optimizer without weight decay
            raise ValueError(f"optimizer {optimizer!r} does not take weight_decay ({e})") from e
        self.lrs = StepSizes(self.optimizer, lr_schedule, bases=[lr] * len(self.optimizer.param_groups))
        self.step = 0  # completed optimizer steps
        self.scaler: torch.amp.GradScaler | None = None  # set by BackpropStep for fp16
        self.loaded_scaler: dict | None = None  # a loaded checkpoint's scaler state, for BackpropStep

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def set_lr(self, lr: float) -> None:
        """A new base step size from the current step on (the schedule keeps scaling it)."""
        self.lrs.set_base(lr, self.step)

    def sync(self) -> None:
        """Under sharding, gather the full weights into :attr:`plain` and the full optimizer state, on rank 0:
        a collective that every rank calls at the same step. Unsharded: nothing to do."""
        if not self.sharded:
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 holds it, on the host
        weights = get_model_state_dict(self.module, options=options)
        self._full_optimizer_state = get_optimizer_state_dict(self.module, self.optimizer, options=options)
        if weights:  # rank 0
            self.plain.load_state_dict(weights)

    def state_dict(self) -> dict:
        """Step, base lrs, the optimizer's state and the fp16 gradient scaler's (the schedule is not stored).
        Under sharding the optimizer state is the full one of the last :meth:`sync` (keyed by parameter
        name)."""
        optimizer = self._full_optimizer_state if self.sharded else self.optimizer.state_dict()
        if optimizer is None:
            raise RuntimeError("a sharded Backprop's state needs a sync() first")
        state = {"step": self.step, "lr": list(self.lrs.bases), "optimizer": optimizer}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if "optimizer" not in state or "step" not in state:
            raise ValueError("not a backprop checkpoint (no optimizer state); it was written by an ES run")
        self.step = int(state["step"])
        if self.sharded:  # every rank read the checkpoint: each keeps its own shards of it
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            options = StateDictOptions(full_state_dict=True)
            set_model_state_dict(self.module, self.plain.state_dict(), options=options)
            set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"], options=options)
            self._full_optimizer_state = state["optimizer"]
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.loaded_scaler = state.get("scaler")
        if self.scaler is not None and self.loaded_scaler is not None:
            self.scaler.load_state_dict(self.loaded_scaler)
        self.lrs.load(state["lr"], self.step)


def shard_model(model: nn.Module) -> nn.Module:
    """FSDP2 (``fully_shard``) on every layer with parameters of its own and every transformer layer, then on
    the root: each unit's parameters are gathered for its forward and backward only. In place; returns
    ``model``."""
    from torch.distributed.fsdp import fully_shard

    units = [m for m in model.modules() if m is not model and (
        isinstance(m, TRANSFORMER_LAYERS)
        or (any(True for _ in m.parameters(recurse=False)) and not inside_transformer_layer(model, m)))]
    for unit in units:
        fully_shard(unit)
    fully_shard(model)
    return model


class BackpropStep:
    """One optimizer step of a supervised task: what :class:`~nesgpu.train.steps.evolution.EvolutionStep` is to
    an ES run.

    Args:
        task: a supervised task with ``batch(step)`` and ``loss(model, x, y)`` (the mean loss).
        backprop: the optimizer side, with the module to call.
        ranks: the processes; each takes its slice of every micro-batch (batch_size must divide evenly).
        precision: "fp32", "bf16" or "fp16" (autocast; fp16 with a GradScaler).
        accumulate: micro-batches per step.
    """

    chunk = None  # the trainer's summary reports the ES chunk size; none here
    progress_key = "train_loss"

    def __init__(self, task, backprop: Backprop, ranks: Ranks, precision: str = "fp32",
                 accumulate: int = 1):
        dtype = autocast_dtype(precision)
        if accumulate < 1:
            raise ValueError(f"accumulate must be >= 1; got {accumulate}")
        if task.batch_size % ranks.world:
            raise ValueError(f"batch_size {task.batch_size} does not split evenly over {ranks.world} processes; "
                             f"expected a multiple of {ranks.world}")
        self.task, self.module, self.backprop, self.ranks = task, backprop.module, backprop, ranks
        self.accumulate = accumulate
        self.device = task.device
        self.dtype = dtype
        self.model = backprop.plain  # what is evaluated and saved
        self.needs_sync = backprop.sharded
        if precision != "fp16":
            backprop.scaler = None
        elif backprop.scaler is None:  # a resumed fp16 run continues with its saved loss scale
            backprop.scaler = torch.amp.GradScaler(self.device.type)
            if backprop.loaded_scaler is not None:
                backprop.scaler.load_state_dict(backprop.loaded_scaler)

    def _autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        """This process's contiguous slice of a micro-batch."""
        if self.ranks.world == 1:
            return t
        size = t.shape[0] // self.ranks.world
        return t[self.ranks.rank * size:(self.ranks.rank + 1) * size]

    def run(self) -> dict:
        """Forward, backward and the optimizer step; returns the step's statistics (one host read)."""
        bp = self.backprop
        step = bp.step + 1
        bp.lrs.apply(bp.step)
        bp.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for i in range(self.accumulate):
            x, y = self.task.batch((step - 1) * self.accumulate + i + 1)
            last = i == self.accumulate - 1
            # DDP: gradients are exchanged once, after the last micro-batch
            sync = contextlib.nullcontext() if last or not hasattr(self.module, "no_sync") else self.module.no_sync()
            with sync:
                with self._autocast():
                    loss = self.task.loss(self.module, self._local(x), self._local(y)) / self.accumulate
                (loss if bp.scaler is None else bp.scaler.scale(loss)).backward()
            total += loss.detach().float()
        if bp.scaler is None:
            bp.optimizer.step()
        else:
            bp.scaler.step(bp.optimizer)
            bp.scaler.update()
        bp.step = step
        total = self.ranks.mean(total)  # the mean loss over the processes, as logged
        loss_value = float(total)  # the step's one read
        if not math.isfinite(loss_value):
            raise ValueError(f"step {step}: the training loss is not finite ({loss_value}); lower --lr")
        return {"train_loss": loss_value, "lr": bp.lr}

    # ----- the interface the training loop drives (see nesgpu.train.steps.evolution.Stepper) ----------------
    @property
    def step(self) -> int:
        return self.backprop.step

    def sync(self) -> None:
        self.backprop.sync()

    def state_dict(self) -> dict:
        return self.backprop.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.backprop.load_state_dict(state)

    def apply_changes(self, old: dict, cfg) -> None:
        """A resumed run's new lr becomes the base from the next step on."""
        if old.get("lr") != cfg.lr:
            self.backprop.set_lr(cfg.lr)

    def summary(self, cfg) -> dict:
        """No population, noise or layer kind."""
        return {"layer": None, "population": None, "directions": None, "sigma": None}

    def finish(self) -> None:
        """Nothing held between steps."""
