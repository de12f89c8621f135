"""Subspace ES (the idea of CoPES, arXiv 2608.02391): each step perturbs and updates a random subset of the
perturbed modules; every other module is the plain model in every member, and keeps its weights that step.

The subset of step t depends on (run seed, t) only, never on the block of directions or the process: the
perturbed modules in a random order seeded by ``derive_seed(seed, t, SUBSPACE_STREAM)``, kept in that order until
their perturbed parameters reach ``fraction`` of all of them (at least one module; fraction 1: every module).

Exactness: a module outside the subset draws its noise as usual, then every floating tensor of its noise record
is zeroed. Every kind's perturbation is linear in those tensors (a Gaussian z, low-rank factors, a shared matrix
under integer permutations or column indices, signs), so each member evaluates the plain weights there, and
||z_d||^2, the estimate and ``dense_noise`` cover the subset alone. The update then skips those modules:
:meth:`nesgpu.Population.apply` steps none of their weights (nor Adam's moments), :meth:`nesgpu.Population.update`
leaves their ``.grad`` as it was (None in the trainer, so the optimizer skips them).

Cost: a shuffle of the module names per step on the host, and one pass writing zeros over the noise of the
modules outside the subset (cheaper than the draw before it); the forward and the update cost what they did.
"""

from __future__ import annotations

import random

import torch

from ..noise import derive_seed
from .model_distribution import ISOTROPIC, ModelDistribution

SUBSPACE_STREAM = 0x73756273  # "subs": keys the subset's order apart from the noise


def check_fraction(value) -> float:
    """``value`` as a float if it is a share in (0, 1]; else a TypeError or ValueError naming the option."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"subspace must be a number in (0, 1]; got {value!r} ({type(value).__name__})")
    if not 0 < value <= 1:
        raise ValueError(f"subspace must be a number in (0, 1] (the share of perturbed parameters per step); "
                         f"got {value!r}")
    return float(value)


def subspace_modules(counts: dict[str, int], fraction: float, seed: int, step: int) -> frozenset[str]:
    """The modules of step ``step``'s subset: ``counts`` gives each perturbed module's perturbed parameters, in
    the model's order; they are shuffled by (``seed``, ``step``) and taken in that order until the count reaches
    ``fraction`` of the total (at least one)."""
    names = list(counts)
    random.Random(derive_seed(seed, step, SUBSPACE_STREAM)).shuffle(names)
    goal, kept, total = fraction * sum(counts.values()), [], 0
    for name in names:
        if kept and total >= goal:
            break
        kept.append(name)
        total += counts[name]
    return frozenset(kept)


def zero_noise_(layer) -> None:
    """Zero every floating tensor of ``layer``'s current noise records: its members evaluate its plain weights."""
    for slot in layer.slots:
        record = layer.noise_record(slot.name)
        for t in record.tensors.values():
            if t.is_floating_point():
                t.zero_()


class ModelSubspace(ModelDistribution):
    """Mixin of :class:`nesgpu.PerturbedModel`: the share of perturbed parameters each step perturbs and updates
    (see the module docstring). Uses the model's ``layers``, ``seed``, ``parameters()`` and
    ``distribution``."""

    @property
    def subspace(self) -> float:
        """The share set by :meth:`set_subspace` (1: every module every step)."""
        return self.__dict__.get("_subspace", 1.0)

    def set_subspace(self, fraction: float) -> None:
        """Perturb and update only a random subset of the modules each step, holding ``fraction`` (in (0, 1]) of
        the perturbed parameters; 1 (the default) perturbs every module. The current noise, if any, is drawn
        again. Refused beside a sigma per parameter or a covariance, whose statistics read every entry's noise."""
        fraction = check_fraction(fraction)
        if fraction < 1:
            self.check_subspace_fits()
        self.__dict__["_subspace"] = fraction
        self.redraw_noise()

    def check_subspace_fits(self) -> None:
        """A ValueError if the model adapts its noise (scales, a covariance): zero noise would corrupt it."""
        if self.distribution != ISOTROPIC:
            raise ValueError("subspace below 1 zeroes the noise of the modules outside each step's subset, which a "
                             "sigma per parameter or a covariance would adapt from; use one or the other")

    def perturbed_counts(self) -> dict[str, int]:
        """Each perturbing module's perturbed parameters, by its name in ``layers``, in the model's order."""
        return {name: layer.perturbed_numel() for name, layer in self.layers.items() if layer.perturbs}

    def subspace_modules(self, step: int) -> frozenset[str] | None:
        """The names (keys of ``layers``) of the modules perturbed and updated at ``step``; None: every one."""
        fraction = self.subspace
        if fraction >= 1:
            return None
        counts = self.perturbed_counts()
        key = (self.seed, step, fraction, tuple(counts.items()))
        held = self.__dict__.get("_subspace_held")
        if held is None or held[0] != key:
            held = self.__dict__["_subspace_held"] = (key, subspace_modules(counts, fraction, self.seed, step))
        return held[1]

    def subspace_share(self, step: int) -> float:
        """The share of the perturbed parameters in the subset of ``step`` (1.0 without a subspace)."""
        inside = self.subspace_modules(step)
        if inside is None:
            return 1.0
        counts = self.perturbed_counts()
        return sum(counts[name] for name in inside) / sum(counts.values())

    def zero_outside_subspace(self, step: int) -> None:
        """Zero the current noise of every module outside the subset of ``step`` (after it was drawn)."""
        inside = self.subspace_modules(step)
        if inside is None:
            return
        self.check_subspace_fits()
        for name, layer in self.layers.items():
            if layer.perturbs and name not in inside:
                zero_noise_(layer)

    def outside_subspace(self, step: int) -> list[torch.nn.Parameter]:
        """The parameters the update writes ``.grad`` into (float32 masters of half-precision ones) of the modules
        outside the subset of ``step``; empty without a subspace."""
        inside = self.subspace_modules(step)
        if inside is None:
            return []
        params, out = iter(self.parameters()), []  # module by module, in each module's order
        for name, layer in self.layers.items():
            for _ in layer.perturbed_parameters():
                p = next(params)
                if name not in inside:
                    out.append(p)
        return out
