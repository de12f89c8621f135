"""One searched option of a ``nesgpu tune`` space: its distribution, and how a space file's entry is read."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..train.setup.config import option_type

RANGE_KEYS = ("low", "high", "log", "step")
Value = bool | int | float | str | None


# ----- one searched option ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """One searched option: a float or int range (``low``, ``high``, ``log``, ``step``) or ``choices``.

    Attributes:
        name: a TrainConfig field, or an option of the base config's layer kind when ``layer_option``.
        choices: the values of a categorical option (hidden sizes as canonical strings, "64,64").
    """

    name: str
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[Value, ...] | None = None
    layer_option: bool = False

    @property
    def kind(self) -> str:
        """"categorical", "int" (low and high are ints) or "float"."""
        if self.choices is not None:
            return "categorical"
        return "int" if isinstance(self.low, int) and isinstance(self.high, int) else "float"

    def suggest(self, trial) -> Value:
        """The value an Optuna trial draws for this option."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def probes(self) -> list[Value]:
        """Values worth checking against the config: the choices, or the range's low, next value up, high."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "int":
            step = self.step or 1
            return [self.low, min(self.low + step, self.high), self.low + (self.high - self.low) // step * step]
        return [self.low, (self.low + self.high) / 2, self.high]

    def to_dict(self) -> dict:
        """The YAML mapping of this option (what :func:`parse_space` reads back)."""
        if self.kind == "categorical":
            return {"choices": list(self.choices)}
        spec = {"low": self.low, "high": self.high}
        if self.log:
            spec["log"] = True
        if self.step is not None:
            spec["step"] = self.step
        return spec


def parse_hidden(value, where: str = "hidden") -> tuple[int, ...]:
    """Hidden sizes from "64,64", 64, [64, 64]; "0", 0, "" and [] mean none (a linear model)."""
    if isinstance(value, str):
        parts = [s.strip() for s in value.split(",") if s.strip()]
        if not all(s.isdigit() for s in parts):
            raise ValueError(f"{where}: expected hidden sizes like \"64,64\"; got {value!r}")
        sizes = tuple(int(s) for s in parts)
    elif isinstance(value, int) and not isinstance(value, bool):
        sizes = (value,)
    elif isinstance(value, (list, tuple)) and all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        sizes = tuple(value)
    else:
        raise ValueError(f"{where}: expected hidden sizes as \"64,64\", 64 or [64, 64]; got {value!r}")
    if sizes in ((), (0,)):
        return ()
    if any(s < 1 for s in sizes):
        raise ValueError(f"{where}: hidden sizes must be >= 1 (or a lone 0 for none); got {value!r}")
    return sizes


def hidden_text(sizes: tuple[int, ...]) -> str:
    """The canonical choice string of hidden sizes: "64,64"; "0" for none."""
    return ",".join(map(str, sizes)) or "0"


# ----- reading and checking a space --------------------------------------------------------------------
def number(value, where: str, key: str):
    """A range bound: an int or a float; YAML 1.1 reads 1e-3 (no dot) as a string, which is converted."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {key} must be a number; got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be finite; got {value!r}")
    return value


def parse_param(name: str, spec, layer_option: bool, where: str) -> Param:
    expected = "{low: L, high: H[, log: true][, step: S]} or {choices: [...]}"
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"{where}: expected {expected}; got {spec!r}")
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise ValueError(f"{where}: choices go alone; got also {sorted(set(spec) - {'choices'})}")
        return Param(name, choices=parse_choices(name, spec["choices"], where), layer_option=layer_option)
    unknown = sorted(set(spec) - set(RANGE_KEYS))
    if unknown or not {"low", "high"} <= set(spec):
        raise ValueError(f"{where}: expected {expected}; got keys {sorted(spec)}")
    low, high = number(spec["low"], where, "low"), number(spec["high"], where, "high")
    step = None if spec.get("step") is None else number(spec["step"], where, "step")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"{where}: log must be true or false; got {log!r}")
    if low >= high:
        raise ValueError(f"{where}: expected low < high; got low {low} and high {high} "
                         f"({'an empty' if low == high else 'a reversed'} range)")
    if log and low <= 0:
        raise ValueError(f"{where}: a log range needs low > 0; got low {low}")
    if log and step is not None:
        raise ValueError(f"{where}: a log range takes no step (Optuna samples it continuously); drop step or log")
    if step is not None:
        check_step(low, high, step, where)
    if isinstance(low, int) and isinstance(high, int) and isinstance(step, float):
        raise ValueError(f"{where}: an int range (int low and high) needs an int step; got {step}")
    return Param(name, low, high, log, step, layer_option=layer_option)


def check_step(low, high, step, where: str) -> None:
    if step <= 0:
        raise ValueError(f"{where}: step must be > 0; got {step}")
    count = (high - low) / step
    if abs(count - round(count)) > 1e-9 * max(1.0, count):
        raise ValueError(f"{where}: high - low must be a multiple of step; got low {low}, high {high}, step {step}")


def parse_choices(name: str, choices, where: str) -> tuple[Value, ...]:
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"{where}: expected a non-empty list of choices; got {choices!r}")
    if name == "hidden":
        values = [hidden_text(parse_hidden(c, where)) for c in choices]
    else:
        floats = "float" in option_type(name)
        values = [choice(c, floats, where) for c in choices]
    duplicates = sorted({repr(v) for v in values if values.count(v) > 1})
    if duplicates:
        raise ValueError(f"{where}: choices must be distinct; got {', '.join(duplicates)} more than once")
    return tuple(values)


def choice(value, floats: bool, where: str) -> Value:
    """A scalar choice; for a float option, YAML's "1e-3" string becomes a number."""
    if floats and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise ValueError(f"{where}: a choice must be a number, a string, a bool or null; got {value!r}")
    return value


__all__ = ["RANGE_KEYS", "Param", "Value", "hidden_text", "parse_hidden", "parse_param"]
