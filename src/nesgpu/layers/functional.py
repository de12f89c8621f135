"""The exact fallback for any other module: per-member parameters through torch.func.

A module that no perturbed layer covers (a custom module with a bare ``nn.Parameter``, ``nn.PReLU``,
``nn.Bilinear``, ...) is evaluated member by member: every trainable parameter of the module and of its
children gets IID Gaussian noise, ``theta + sigma * s_r * z_d`` is built for every row, and
``torch.func.vmap`` runs ``torch.func.functional_call`` over the rows, each row as a batch of one.
It is exact and slow: it materialises R * D copies of the module's parameters and loses the batched
products, so keep it for small modules (``benchmarks/layer_speed.py`` measures it).

Its input is the population rows (the model's input rows), or those rows' tokens flattened to 2-D,
(rows * T, features), as an MoE router sees them: member i then owns tokens [i T, (i + 1) T). Any other
first dimension is an error naming the module, never a guess. A module vmap cannot run (data-dependent
control flow) runs member by member in a loop, and so does a module handed a state object (a KV or recurrent
cache): each member with its own view of the state, merged back afterwards (:mod:`.member_state`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..kinds import Gaussian
from .base import PerturbedModule
from .guarded_value import NeedsFallback, parent_name
from .layout import member_tokens
from .member_state import attribute_state, holds_state, member_view, merge_members, written_tensors
from .swap import swap_class


class FunctionalPerturbed(PerturbedModule):
    """Mixin of the fallback: use :func:`functional_fallback` to apply it to a module."""

    def population_forward(self, *args, **kwargs):
        if self._shares_its_input(args, kwargs):
            return self._shared_input_call(args, kwargs)
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if first is None or first.dim() < 1:
            raise ValueError(f"{self.label}: a population call needs a tensor argument whose first dimension is the "
                             f"rows (repeats * directions); got {[type(a).__name__ for a in args]}, so its members' "
                             f"outputs have no rows to go to; freeze it (convert(..., freeze=[{self.layer_name!r}]))")
        layout, n = self.population_layout, first.shape[0]
        rows = n if layout is None else layout.rows  # unknown (a sequence-first model): its first dimension
        tokens = None if layout is None else member_tokens(layout, first, self.label, self.layer_name)
        tokens = None if tokens == 1 else tokens  # rows * T tokens: member i owns tokens [i T, (i + 1) T)
        params = self._member_parameters(rows, first.device)
        # per-row tensors inside tuples too (cos, sin of the rows); a list or dict argument holding them is a state
        # a member may change (RWKV's list of states), handed over whole, as a cache is
        mutable = {id(a) for a in (*args, *kwargs.values()) if isinstance(a, (list, dict)) and any(
            isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == n for t in tree_flatten(a)[0])}
        leaves, spec = tree_flatten((args, kwargs), is_leaf=lambda a: id(a) in mutable)
        batched = [isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == n for a in leaves]
        inputs = [a.view(rows, tokens, *a.shape[1:]) if b and tokens else a for a, b in zip(leaves, batched)]

        def member(member_params, *member_leaves):
            member_leaves = [a.unsqueeze(0) if b and not tokens else a for a, b in zip(member_leaves, batched)]
            positional, keywords = tree_unflatten(member_leaves, spec)
            return functional_call(self, member_params, tuple(positional), keywords)

        stateful = [holds_state(a) or id(a) in mutable for a in inputs]
        if any(stateful) and tokens:
            raise ValueError(f"{self.label}: the exact fallback was handed a state object (a cache) together with its "
                             f"rows' tokens flattened, which it cannot split member by member; freeze this module")
        with self._member_calls():
            out = (_per_member_with_state(member, params, inputs, batched, stateful, rows) if any(stateful)
                   else _per_member(member, params, inputs, batched, rows))
        # each member ran on its own rows, a batch of 1 (or of its T tokens): its outputs, stacked (rows, batch,
        # ...), are the population's output (rows * batch, ...) as the plain module's would be for all rows
        return tree_map(lambda t: t.flatten(0, 1) if isinstance(t, torch.Tensor) and t.dim() >= 2 else t, out)

    def _cannot_run(self, error: Exception) -> Exception:
        """``error`` of the module's own code run member by member, named: the module, why, what to do (an
        error of ours, or an allocation failure, as it is)."""
        text = str(error).splitlines()[0] if str(error) else ""
        if isinstance(error, NeedsFallback) or "memory" in text or text.startswith(self.label):
            return error
        return RuntimeError(f"{self.label}: the exact fallback cannot run this module member by member "
                            f"({type(error).__name__}: {text[:200]}), perhaps because its code mixes or regroups its "
                            f"rows. Freeze it (convert(..., freeze=[{self.layer_name!r}])), or run its parent through "
                            f"the fallback (convert(..., fallback=[{parent_name(self.layer_name)!r}]))")

    def _shares_its_input(self, args, kwargs) -> bool:
        """Whether no argument can hold the population's rows (no dimension of any tensor a multiple of them):
        every member sees the same input (a positional embedding of the sequence's positions, computed once a
        call). Where a dimension could be the rows, the module's own checks decide (never a guess)."""
        layout = self.population_layout
        if layout is None or not self.perturbs:
            return False
        return not any(holds_state(a) or isinstance(a, torch.Tensor) and any(n % layout.rows == 0 for n in a.shape)
                       for a in tree_flatten((args, kwargs))[0])

    def _shared_input_call(self, args, kwargs):
        """Every member on the same input: the outputs stacked as (rows, ...), a leading dimension of members
        that broadcasts against the rows where the plain output broadcast against the batch."""
        rows = self.population_layout.rows
        params = self._member_parameters(rows, next(iter(self.perturbed_parameters().values())).device)

        def member(member_params):
            return functional_call(self, member_params, tuple(args), kwargs)

        with self._member_calls():
            try:
                return vmap(member, randomness="different")(params)
            except RuntimeError:
                return _stacked([member({k: v[i] for k, v in params.items()}) for i in range(rows)])

    def _member_parameters(self, rows: int, device: torch.device) -> dict[str, torch.Tensor]:
        """Every row's member's values of each perturbed parameter, (rows, *shape), in the parameter's dtype."""
        own = self.perturbed_parameters()
        dtype = next((p.dtype for p in own.values()), torch.get_default_dtype())
        pop = self.population_of(rows, dtype, device)
        return {name: self.member_values(name, pop, p.dtype).reshape(rows, *p.shape) for name, p in own.items()}

    @contextmanager
    def _member_calls(self):
        """The members' calls: the module's inner calls run its plain forward; an error of the module's own code
        names the module (see :meth:`_cannot_run`)."""
        state = self.perturbation
        active, state.active = state.active, None
        before = attribute_state(self)
        try:
            yield
        except (RuntimeError, IndexError, TypeError, ValueError) as e:
            raise self._cannot_run(e) from e
        finally:
            state.active = active
        written = written_tensors(self, before)
        if written:  # each member's state would overwrite the last: no member's own
            raise RuntimeError(f"{self.label}: its forward writes {written[0]!r}, a state it keeps between calls, "
                               f"which the exact fallback cannot keep member by member; freeze it (convert(..., "
                               f"freeze=[{self.layer_name!r}]))")


def _per_member(member, params, inputs, batched, rows):
    """``member`` for every row, vectorised with vmap; a module vmap cannot run (data-dependent control flow,
    ``.item()``) runs row by row, which is exact too."""
    try:
        # "different": dropout and other random ops draw independently for every member
        return vmap(member, in_dims=(0, *[0 if b else None for b in batched]), randomness="different")(
            params, *inputs)
    except RuntimeError:
        outs = [member({k: v[i] for k, v in params.items()}, *[a[i] if b else a for a, b in zip(inputs, batched)])
                for i in range(rows)]
        return _stacked(outs)


def _per_member_with_state(member, params, inputs, batched, stateful, rows):
    """``member`` row by row, each handed its own view of the state objects (caches), which are merged back
    afterwards (see :mod:`nesgpu.layers.member_state`); an output that is a member's view is the state itself."""
    views = {k: [] for k, s in enumerate(stateful) if s}
    outs = []
    for i in range(rows):
        own = [member_view(a, i, rows) if s else a[i] if b else a for a, b, s in zip(inputs, batched, stateful)]
        for k in views:
            views[k].append(own[k])
        outs.append(member({k: v[i] for k, v in params.items()}, *own))
    for k, member_views in views.items():
        merge_members(inputs[k], member_views, rows)
    originals = {id(member_views[0]): inputs[k] for k, member_views in views.items()}
    return tree_map(lambda leaf: originals.get(id(leaf), leaf), _stacked(outs))


def _stacked(outs: list):
    """The members' outputs stacked leaf by leaf (rows, ...); a leaf that is not a tensor: the first member's."""
    flat = [tree_flatten(o)[0] for o in outs]
    spec = tree_flatten(outs[0])[1]
    return tree_unflatten([torch.stack(leaves) if isinstance(leaves[0], torch.Tensor) else leaves[0]
                           for leaves in zip(*flat)], spec)


def functional_fallback(module: nn.Module, directions: int | None = None) -> nn.Module:
    """Turn ``module`` (in place) into its population-aware version that perturbs every trainable parameter
    of it and of its children exactly, through torch.func. Its class becomes a subclass of its own, so its
    state_dict, parameters and plain forward stay the same. A child called in a population call other than
    through the module's forward (a method of the module, or a parent calling the child itself) would compute
    with unperturbed weights: it raises :class:`nesgpu.layers.guarded_value.NeedsFallback`."""
    swap_class(module, FunctionalPerturbed, "Functional")
    module.init_perturbation(Gaussian(), directions, {}, "elementwise", recurse=True)
    for child in module.modules():
        if child is not module:
            child.__dict__[FALLBACK_ROOT] = module  # a plain attribute: not a submodule (deepcopy follows it)
            child.register_forward_pre_hook(child_call_guard)
    return module


FALLBACK_ROOT = "nesgpu_fallback_root"
"""The attribute through which a fallback module's children know it."""


def child_call_guard(child: nn.Module, args) -> None:
    """The forward pre-hook on a fallback module's children: a child called while the fallback module is
    perturbing, but not inside its own forward, raises."""
    root = child.__dict__.get(FALLBACK_ROOT)
    if root is not None and root.is_perturbing and not root.own_call_running:
        name, parent = root.layer_name, parent_name(root.layer_name)
        raise NeedsFallback(f"{root.label}: its child {type(child).__name__} was called in a population call other "
                            f"than through {name or 'the model'}'s forward (a method of it, or its parent calling the "
                            f"child), which would compute with unperturbed weights; run its parent through the exact "
                            f"fallback: convert(..., fallback=[{parent!r}])", parent,
                            f"calls {root.label}'s child {type(child).__name__} outside its forward")
