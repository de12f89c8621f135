"""Float32 master weights of a half-precision model's perturbed parameters (see
:meth:`nesgpu.PerturbedModel.parameters`): the optimizer steps them, the model's own weights are their
rounding, refreshed before each call of the model."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable

import torch
from torch import nn

from .layers import HALF


class _Master:
    """A float32 master copy of a half-precision parameter, and the master's version last copied back."""

    def __init__(self, param: nn.Parameter):
        self.param = param
        self.value = nn.Parameter(param.detach().float(), requires_grad=param.requires_grad)
        self.version = self.value._version


class MasterWeights:
    """The masters of the half-precision ones among ``params``; those ``previous`` holds already are kept (an
    optimizer may hold them). ``keep=False``: none (the weights take their update in place), the dtype still read."""

    def __init__(self, params: Iterable[nn.Parameter], previous: MasterWeights | None = None, keep: bool = True):
        old = {} if previous is None else previous._by_id
        half = [p for p in params if p.dtype in HALF]
        self._by_id = {id(p): old.get(id(p)) or _Master(p) for p in half} if keep else {}
        self.dtype = half[0].dtype if half else None  # the model's half precision
        self._updated: dict[int, int] = {}  # each master's version when the last ES estimate went into its .grad
        self._warned = False

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def of(self, param: nn.Parameter) -> nn.Parameter:
        """The master of ``param`` (``param`` itself when it has none)."""
        master = self._by_id.get(id(param))
        return param if master is None else master.value

    def sync(self) -> None:
        """Copy master weights that changed since the last copy into the model."""
        for master in self._by_id.values():
            if master.version != master.value._version:
                with torch.no_grad():
                    master.param.copy_(master.value)
                master.version = master.value._version

    def note_update(self) -> None:
        """An ES estimate has just been added to the masters' ``.grad``."""
        self._updated = {key: master.value._version for key, master in self._by_id.items()}

    def check_stepped(self) -> None:
        """At a new step: warn (once) when the last estimate was never applied: every master still holds its
        ``.grad`` and its value, so no optimizer stepped them (one built on ``model.parameters()`` holds the
        half-precision weights, whose ``.grad`` stays None: it trains nothing)."""
        updated, self._updated = self._updated, {}
        if not updated or self._warned:
            return
        if all(m.value.grad is not None and m.value._version == updated.get(key) for key, m in self._by_id.items()):
            self._warned = True
            warnings.warn("the last ES estimate was not applied: the model's half-precision weights are trained "
                          "through float32 master weights, whose .grad it went into, and no optimizer stepped "
                          "them; build the optimizer on PerturbedModel.parameters(), not model.parameters()",
                          RuntimeWarning, stacklevel=4)

    def state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The master weights by ``model``'s parameter names."""
        names = {id(p): name for name, p in model.named_parameters()}
        return {names[key]: master.value.detach().clone() for key, master in self._by_id.items()}

    def load_state(self, model: nn.Module, state: dict[str, torch.Tensor] | None) -> None:
        """The masters from :meth:`state` (``None``, or a name it lacks: from the model's own weights), and the
        model's weights from them."""
        names = {id(p): name for name, p in model.named_parameters()}
        with torch.no_grad():
            for key, master in self._by_id.items():
                value = (state or {}).get(names[key])
                master.value.copy_(master.param if value is None else value)
                master.param.copy_(master.value)
                master.version = master.value._version


# the attribute of a PerturbedModel's model that names its masters (weakly: they live as long as the
# PerturbedModel), for sync_masters
MASTERS = "_nesgpu_masters"


def register(model: nn.Module, masters: MasterWeights) -> None:
    """``masters`` are ``model``'s (see :func:`sync_masters`)."""
    if masters:
        model.__dict__[MASTERS] = weakref.ref(masters)


def sync_masters(model: nn.Module) -> None:
    """Copy the latest optimizer step of every master into ``model``'s half-precision weights (and those of any
    submodule that is a PerturbedModel's model): what a call of the model does first, for those that read the
    weights without calling it (``nesgpu.export``)."""
    for module in model.modules():
        masters = module.__dict__.get(MASTERS)
        if masters is not None and masters() is not None:
            masters().sync()
