"""Parameters a perturbed module shares beyond itself: tied to another module's, or read by a parent.

- **Tied** (one tensor used by two modules, as an embedding table and an output head): the owner draws the
  noise z_d and takes the whole update; the borrower applies the same z_d in its own product, so every use
  sees theta + sigma s_r z_d and the tensor is perturbed once.
- **Read by a parent** in population mode (``F.linear(h, self.emb.weight)``): the parameter holds the
  unperturbed weights, so the computation would silently ignore every member's noise. Such a read returns a
  :class:`nesgpu.layers.guarded_value.GuardedValue`: its metadata passes, any other use raises (or is computed per
  member by the module, see ``guarded_use``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

from torch import nn

from .guarded_value import GuardedValue


class Borrowed(NamedTuple):
    """A parameter tied to another module's: that module (the owner) draws its noise and takes its update;
    this one applies the same noise z_d in its own product."""

    owner: nn.Module
    name: str
    label: str  # the owner's parameter as the model names it, for print(model)


class SharedParameters(nn.Module):
    """The tie and read-guard part of :class:`nesgpu.layers.PerturbedModule` (its base)."""

    def borrow(self, name: str, owner: SharedParameters, owner_name: str, label: str = "") -> None:
        """Tie parameter ``name`` of this module to ``owner_name`` of ``owner`` (one tensor used twice, as an
        embedding table and an output head): every use sees the same theta + sigma s_r z_d, the owner
        draws z_d and takes the whole update, so the tied parameter is perturbed once."""
        problem = self.borrow_problem(name, owner, owner_name)
        if problem:
            raise ValueError(problem)
        self.perturbation.borrowed[name] = Borrowed(owner, owner_name, label or owner_name)
        self.declare_parameters()

    def borrow_problem(self, name: str, owner: SharedParameters, owner_name: str) -> str | None:
        """Why :meth:`borrow` would refuse this tie (None: it would not)."""
        slot = next((s for s in owner.slots if s.name == owner_name), None)
        if slot is None:
            return (f"{type(owner).__name__}.{owner_name} is not perturbed (frozen or borrowed); expected the module "
                    f"that draws the tied parameter's noise")
        geometry = self.perturbation.matrices.get(name)
        if geometry is None or slot.geometry is None or geometry.shape != slot.geometry.shape:
            return (f"{type(self).__name__}.{name} is tied to {type(owner).__name__}.{owner_name}, but their "
                    f"geometries differ ({geometry} and {slot.geometry}); expected the same matrix")
        if not slot.kind.supports(self.product):
            return (f"{type(self).__name__}.{name} is tied to {type(owner).__name__}.{owner_name}, whose kind "
                    f"{slot.kind.name!r} has no {self.product} product; use kind 'lowrank' or 'gaussian' "
                    f"for tied weights")
        return None

    @property
    def own_call_running(self) -> bool:
        """Whether the module is inside :meth:`own_call` (its own population forward)."""
        return self.perturbation.inside

    @property
    def ties(self) -> dict[str, Borrowed]:
        """The parameters this module borrows from another module (tied weights), by attribute name."""
        return dict(self.perturbation.borrowed)

    @contextmanager
    def own_call(self):
        """Within this block the module reads its own perturbed parameters (its population forward, or
        another entry point such as a shared-input forward): the read guard lets them through."""
        state = self.perturbation  # plain attributes: nn.Module.__setattr__'s checks cost more than the forward's ops
        inside, state.inside = state.inside, True
        try:
            yield
        finally:
            state.inside = inside

    def __getattr__(self, name: str):
        value = super().__getattr__(name)
        state = self.__dict__.get("perturbation")  # not yet there while the module is being built
        if state is not None and state.active is not None and not state.inside and name in state.guarded:
            # a parent reading a perturbed parameter would compute with the unperturbed weights: its metadata
            # reads pass, any use of its values goes through guarded_use (an error unless the module computes it)
            return GuardedValue(value, self, name)
        return value

    def guarded_use(self, guard: GuardedValue, func, args: tuple, kwargs: dict):
        """The result of ``func(*args, **kwargs)`` on a parameter a parent read directly in a population
        call, computed per member, or NotImplemented (then the use is an error). A module type that can
        compute a use (an MoE router's ``F.linear``) overrides this."""
        return NotImplemented


ALIASES = "nesgpu_aliases"
"""The attribute of an :class:`AliasHolder`: {its attribute: :class:`Alias`}."""


class Alias(NamedTuple):
    """The perturbed module that perturbs a parameter another module holds too, and its attribute there."""

    owner: nn.Module
    attr: str


class AliasHolder(nn.Module):
    """Mixin of a module that holds, as its own, a parameter a perturbed child of it perturbs (BERT's LM-head
    bias, tied to its decoder's): read during a population call, it is that child's guarded value."""

    def __getattr__(self, name: str):
        value = super().__getattr__(name)
        alias = self.__dict__.get(ALIASES, {}).get(name)
        if alias is not None and alias.owner.is_perturbing and not alias.owner.own_call_running:
            return GuardedValue(value, alias.owner, alias.attr)
        return value
