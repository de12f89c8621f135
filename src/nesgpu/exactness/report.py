"""What :func:`nesgpu.check` found: per module the worst relative difference, the fallback, the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModuleError:
    """A module's worst relative difference between its population rows and its members' own outputs."""

    name: str
    type: str
    error: float


@dataclass(frozen=True)
class CheckReport:
    """The result of :func:`nesgpu.check`.

    Attributes:
        exact: every compared module, the model's output among them, is within ``tolerance`` (and generation,
            when checked, is the same: greedy and sampled), and nothing was refused.
        worst: the model output's worst relative difference over all members (NaN when not compared).
        modules: every compared module, the largest difference first.
        fallback: the modules in the exact (slow) torch.func fallback, each with why.
        fallback_share: the share of the trainable parameters that the fallback perturbs.
        refused: why convert or the first population call refused the model (None: it was not).
        generate: what the ``generate()`` comparisons found, greedy and sampled (None: not asked).
        first_difference: the first module, in the order the modules finished, whose output differs: where
            the difference starts (None: none differs).
        low_precision: the parts of the model whose own code computes below the check's precision (float32 or
            half in the float64 check: a norm's or a softmax's upcast), each as "module (Type): its operations
            in float32"; they round at that precision by design, and ``tolerance`` was raised to float32's.
        unused: perturbed modules these inputs never reach (an encoder-decoder's cross-attention, a vision
            tower in a text-only call): exact but irrelevant here; freeze them to train with these inputs.
    """

    exact: bool
    tolerance: float
    worst: float
    modules: tuple[ModuleError, ...] = ()
    fallback: dict[str, str] = field(default_factory=dict)
    fallback_share: float = 0.0
    refused: str | None = None
    generate: str | None = None
    first_difference: ModuleError | None = None
    low_precision: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()

    @classmethod
    def refusal(cls, why: str, tolerance: float, fallback: dict[str, str] | None = None) -> CheckReport:
        return cls(False, tolerance, float("nan"), fallback=fallback or {}, refused=why)

    @classmethod
    def of(cls, errors: dict[str, ModuleError], order: list[str], tolerance: float, fallback: dict[str, str],
           share: float, generate: str | None, low_precision: list[str] = (), unused: list[str] = ()) -> CheckReport:
        """``errors`` by module name, ``order``: the names in the order the modules finished."""
        modules = tuple(sorted(errors.values(), key=lambda m: -m.error))
        first = next((errors[n] for n in order if n in errors and errors[n].error > tolerance), None)
        root = errors.get("")
        worst = root.error if root is not None else float("nan")
        exact = (root is not None and all(m.error <= tolerance for m in modules)
                 and (generate is None or generate.startswith("exact")))
        return cls(exact, tolerance, worst, modules, fallback, share, None, generate, first, tuple(low_precision),
                   tuple(unused))

    def __str__(self) -> str:
        if self.refused is not None:
            return f"refused: {self.refused}"
        verdict = "exact" if self.exact else "DIFFERENT"
        lines = [f"{verdict}: the model's output differs from its members' own by at most {self.worst:.2e} "
                 f"(relative; tolerance {self.tolerance:.0e})"]
        if self.low_precision:
            more = len(self.low_precision) - 4
            shown = "; ".join(self.low_precision[:4]) + (f"; and {more} more" if more > 0 else "")
            lines.append(f"your model's own code computes some parts below the check's precision: {shown}. "
                         f"That is its design (a norm or a softmax that upcasts, say), not nesgpu's: those parts "
                         f"round at their lower precision, so the check allowed float32's rounding (tolerance "
                         f"{self.tolerance:.0e}); a difference below it is that rounding, not a wrong population "
                         f"row, and nothing needs changing to train")
        if self.unused:
            shown = ", ".join(self.unused[:3]) + (" ..." if len(self.unused) > 3 else "")
            lines.append(f"{len(self.unused)} perturbed modules these inputs never reach: {shown}; freeze them "
                         f"(convert(..., freeze=[...])) to train with such inputs")
        first = self.first_difference
        if first is not None:
            lines.append(f"first differing module: {first.name or 'model'} ({first.type}), {first.error:.2e}")
        if "" not in {m.name for m in self.modules}:
            lines.append("the model's output could not be lined up with its members' outputs")
        if self.generate is not None:
            lines.append(f"generate: {self.generate}")
        lines.append(f"exact fallback: {len(self.fallback)} modules, {100 * self.fallback_share:.1f}% of the "
                     f"trainable parameters")
        lines += [f"  {name or 'model'}: {why}" for name, why in self.fallback.items()]
        lines.append(f"{'module':<48} {'type':<28} {'worst rel. error':>16}")
        lines += [f"{m.name or 'model':<48} {m.type[:28]:<28} {m.error:>16.2e}" for m in self.modules[:20]]
        if len(self.modules) > 20:
            lines.append(f"... {len(self.modules) - 20} more modules, all at or below {self.modules[20].error:.2e}")
        return "\n".join(lines)
