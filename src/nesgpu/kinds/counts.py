"""Counts given as a fraction or a number, for the kinds' sparsity options."""

from __future__ import annotations


def resolve_count(value: float | None, total: int, name: str) -> int:
    """A count in [1, total] from a fraction (float in (0, 1]) or a count (int in [1, total]); None is all."""
    if value is None:
        return total
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a fraction (float) or a count (int); got {type(value).__name__}")
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"{name} as a fraction must be in (0, 1]; got {value}")
        return max(1, round(value * total))
    if not 1 <= value <= total:
        raise ValueError(f"{name} as a count must be in [1, {total}]; got {value}")
    return value
