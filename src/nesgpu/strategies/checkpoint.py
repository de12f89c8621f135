"""Checks of what a checkpoint hands a strategy back: its tensors (covariance factor, evolution paths, C) before
any step reads them, so that a damaged or tampered checkpoint is refused by name instead of stalling a run
silently, training on absurd members, or failing later with an error that blames the task.

Tolerances (generous: a checkpoint a run wrote passes by orders of magnitude):

- C positive definite: C - 1e-14 max(diag C) I has a Cholesky factor (a condition number up to about 1e14,
  CMA-ES's practical limit), and C symmetric to 1e-4 of its largest entry (the rank-mu sum is summed in the
  factor's dtype, float32 for a float32 model).
- A consistent with C: the eigenvalues of A^-1 C A^-T within [1/4, 4] (A is C's square root as last decomposed;
  C moves by about a tenth in between).
- xNES's B: det B = 1 (its update is the exponential of a traceless matrix), taken as |det B|^(1/n) in [1/2, 2],
  and B B^T conditioned as C may be (its singular values at most 1e7 apart).
- The paths: |p_s| at most the length that kicks of members :data:`LONGEST` times longer than typical sum up to,
  sqrt((2 - c_s) mu_eff / c_s) LONGEST E|N(0, I)|; |p_c| the same for c_c, times :data:`TYPICAL` sqrt(tr C)
  (it sums y = A z under the A of past steps).
"""

from __future__ import annotations

import math

import torch

LONGEST = 10.0  # a member's noise |z| / E|N(0, I)| above which a path is refused
TYPICAL = 10.0  # for p_c: room for C's drift over the path's horizon (p_c sums y = A z under past A)
CONSISTENT = (0.25, 4.0)  # the eigenvalues of A^-1 C A^-T
CONDITION = 1e-14  # C's smallest eigenvalue / its largest diagonal entry, at least
SYMMETRIC = 1e-4  # |C - C^T| / max |C|, at most
DETERMINANT = (0.5, 2.0)  # xNES: |det B|^(1/n)


def refusal(strategy: str, entry: str, got: str, expected: str) -> ValueError:
    """The error for a checkpoint's ``entry`` that is not what ``strategy`` wrote."""
    return ValueError(f"the checkpoint's {entry} for strategy {strategy!r} {got}; expected {expected} (the checkpoint "
                      f"is damaged or was changed; resume from another, or start a new run)")


def tensor(strategy: str, entry: str, value, shape: tuple[int, ...]) -> torch.Tensor:
    """``value`` as a float64 tensor if it is a finite floating-point tensor of ``shape``; else a refusal."""
    expected = f"a finite floating-point tensor of shape {shape}"
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        got = f"dtype {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise refusal(strategy, entry, f"is {got}", expected)
    if value.is_meta:
        raise refusal(strategy, entry, "holds no data (a meta tensor)", expected)
    if tuple(value.shape) != shape:
        raise refusal(strategy, entry, f"has shape {tuple(value.shape)}", expected)
    value = value.detach().to(torch.float64)
    if not bool(value.isfinite().all()):
        raise refusal(strategy, entry, "is not finite everywhere", expected)
    return value


def paths(strategy: str, values: dict, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The checkpoint's evolution paths, each checked by :func:`tensor`: all of ``shapes`` or none (a run whose
    every step tied has none yet); an entry of another name is refused."""
    held = values.get("paths") or {}
    if not isinstance(held, dict):
        raise refusal(strategy, "paths", f"is {type(held).__name__}", "a dict of tensors")
    if not held:
        return {}
    if set(held) != set(shapes):
        names = sorted(set(held) ^ set(shapes), key=str)
        raise refusal(strategy, "paths", f"are {sorted(held, key=str)[:4]} ({names[0]!r} differs)",
                      f"none, or {sorted(shapes)[:4]}" + ("..." if len(shapes) > 4 else ""))
    return {name: tensor(strategy, f"path {name!r}", held[name], shape) for name, shape in shapes.items()}


def no_paths(strategy: str, values: dict) -> None:
    """A strategy that keeps no evolution paths: the checkpoint holds none."""
    held = values.get("paths")
    if held is not None and (not isinstance(held, dict) or held):
        got = f"are {sorted(held, key=str)[:4]}" if isinstance(held, dict) else f"is {type(held).__name__}"
        raise refusal(strategy, "paths", got, "none (this strategy keeps no evolution paths)")


def path_length(strategy: str, entry: str, path: torch.Tensor, rate: float, mu_eff: float, chi_n: float,
                scale: float = 1.0) -> None:
    """|path| within the bound of the module docstring for a path of ``rate`` (``scale``: sqrt(tr C) for p_c)."""
    bound = LONGEST * chi_n * math.sqrt((2 - rate) * mu_eff / rate) * scale
    length = float(path.norm())
    if not length <= bound:
        raise refusal(strategy, entry, f"has length {length:.4g}", f"at most {bound:.4g} (the longest its updates "
                      f"can make it; a run's stays near {chi_n:.3g})")


def positive_definite(strategy: str, entry: str, cov: torch.Tensor) -> None:
    """C symmetric and positive definite within the tolerances of the module docstring."""
    expected = (f"a symmetric positive definite covariance (eigenvalues above {CONDITION:g} times its largest "
                f"diagonal entry)")
    largest = float(cov.abs().max())
    if float((cov - cov.t()).abs().max()) > SYMMETRIC * largest:
        raise refusal(strategy, entry, "is not symmetric", expected)
    shifted = (cov + cov.t()) / 2 - CONDITION * float(cov.diagonal().max()) * torch.eye(
        cov.shape[0], dtype=cov.dtype, device=cov.device)
    if largest == 0 or int(torch.linalg.cholesky_ex(shifted).info) != 0:
        raise refusal(strategy, entry, "is not positive definite", expected)


def consistent(strategy: str, factor: torch.Tensor, cov: torch.Tensor) -> None:
    """The factor A and C agree: A^-1 C A^-T's eigenvalues within :data:`CONSISTENT` (by two Cholesky factors)."""
    expected = (f"C's square root as last decomposed (the eigenvalues of A^-1 C A^-T within [{CONSISTENT[0]:g}, "
                f"{CONSISTENT[1]:g}])")
    left, info = torch.linalg.solve_ex(factor, cov)
    whitened, info2 = torch.linalg.solve_ex(factor, left.t())
    if int(info) or int(info2) or not bool(whitened.isfinite().all()):
        raise refusal(strategy, "covariance factor", "is singular", expected)
    whitened = (whitened + whitened.t()) / 2
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    low, high = CONSISTENT
    if int(torch.linalg.cholesky_ex(whitened - low * eye).info) or \
            int(torch.linalg.cholesky_ex(high * eye - whitened).info):
        raise refusal(strategy, "covariance factor", "does not fit the covariance C of its paths", expected)


def unit_determinant(strategy: str, factor: torch.Tensor) -> None:
    """xNES's factor B: det B > 0 and |det B|^(1/n) within :data:`DETERMINANT`."""
    sign, log = torch.linalg.slogdet(factor)
    mean = math.exp(float(log) / factor.shape[0]) if float(sign) > 0 else 0.0
    low, high = DETERMINANT
    if not low <= mean <= high:
        got = f"has det B^(1/n) = {mean:.4g}" if float(sign) > 0 else "is singular or reflects (det B <= 0)"
        raise refusal(strategy, "covariance factor", got, f"det B = 1 (xNES keeps it; |det B|^(1/n) within "
                      f"[{low:g}, {high:g}])")


def well_conditioned(strategy: str, factor: torch.Tensor) -> None:
    """A factor B whose covariance B B^T keeps the condition number C may have (1 / :data:`CONDITION`): its
    singular values within a ratio of sqrt(1 / CONDITION) (det B = 1 says nothing of their spread)."""
    values = torch.linalg.svdvals(factor.double())
    ratio = float(values[0] / values[-1]) if float(values[-1]) > 0 else math.inf
    if not ratio <= math.sqrt(1 / CONDITION):
        raise refusal(strategy, "covariance factor", f"has singular values {ratio:.3g} times apart",
                      f"at most {math.sqrt(1 / CONDITION):.3g} (a covariance conditioned to {1 / CONDITION:.0e})")


__all__ = ["consistent", "no_paths", "path_length", "paths", "positive_definite", "refusal", "tensor",
           "unit_determinant", "well_conditioned"]
