"""Search spaces of ``nesgpu tune``: the YAML format, its validation, and the default space of each strategy.

A space maps option names to distributions. A name is a TrainConfig field (``lr``, ``population``,
``hidden``, ...) or an option of the base config's layer kind (``rank`` of ``lowrank``)::

    lr: {low: 1.0e-4, high: 0.1, log: true}     # float (low or high a float), log-uniform
    sigma: {low: 0.01, high: 0.5}               # float, uniform
    weight_decay: {low: 0.0, high: 0.02, step: 0.005}
    population: {low: 64, high: 512, step: 64}  # int (low and high ints); log: true also works without step
    hidden: {choices: ["32", "64,64", [128]]}   # categorical; hidden sizes as "64,64", 64 or [64, 64]; "0": none
    rank: {low: 1, high: 8}                     # an option of the layer kind (here lowrank)

Every value a trial could draw at the edges of a range (low, the next value up, high) and every choice is
checked by resolving the base config with it, so a space the config would refuse fails before the first
trial, with an error naming the option.

Default spaces (:data:`DEFAULT_SPACES`, used without ``--space``) sit around the base config's resolved values,
that is the task presets unless the base config sets them:

| option | range | strategies |
|---|---|---|
| lr | log-uniform, value / 10 .. value * 10 | all |
| sigma | log-uniform, value / 10 .. value * 10 | ES |
| population | int, p .. 4p in steps of p, p = population / 2 (rounded down to even) | ES |
| weight_decay | uniform 0 .. 0.02 (openai_es), 0 .. 0.1 (backprop) | openai_es, backprop |
| rank | int, log-uniform 1 .. 8 (layer lowrank only) | ES |
| hidden | choices w/2, w, 2w, "w,w" (w: the first hidden size; a linear model: w = 16, and "0") | ES, model mlp only |
| batch_size | choices b/2, b, 2b | backprop |
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..layers import KINDS
from ..strategies import STRATEGIES
from ..train.config import BACKPROP, BACKPROP_ONLY, ES_ONLY, TrainConfig

# options a space may not search, and why
NOT_SEARCHABLE = {
    "out": "each trial runs in DIR/trials/NNNN",
    "layer_options": "search a layer option by its own name, e.g. rank",
    "task": "the metrics of different tasks do not compare",
}
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


@dataclass(frozen=True)
class SearchSpace:
    """The options a study searches; :meth:`apply` turns a trial's values into a training config."""

    params: tuple[Param, ...]

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def suggest(self, trial) -> dict[str, Value]:
        """One value per option, drawn by an Optuna trial (its ``params``)."""
        return {p.name: p.suggest(trial) for p in self.params}

    def apply(self, base: TrainConfig, values: dict[str, Value]) -> TrainConfig:
        """``base`` (unresolved) with ``values`` set: fields replaced, layer options merged into
        ``layer_options``, hidden strings turned into sizes. Options of ``values`` outside the space are an
        error."""
        by_name = {p.name: p for p in self.params}
        unknown = sorted(set(values) - set(by_name))
        if unknown:
            raise ValueError(f"values for {unknown} are outside the search space {self.names}")
        fields = {n: config_value(n, v) for n, v in values.items() if not by_name[n].layer_option}
        options = {n: v for n, v in values.items() if by_name[n].layer_option}
        return dataclasses.replace(base, **fields, layer_options={**base.layer_options, **options})

    def categorical(self) -> list[str]:
        return [p.name for p in self.params if p.kind == "categorical"]

    def to_dict(self) -> dict[str, dict]:
        """The space as the YAML mapping ``--space`` reads (``nesgpu tune --print-space``)."""
        return {p.name: p.to_dict() for p in self.params}


def config_value(name: str, value: Value):
    """A trial's value as the TrainConfig field takes it: hidden "64,64" becomes (64, 64), "0" ()."""
    return parse_hidden(value, name) if name == "hidden" else value


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
def read_space(path: str | Path) -> dict:
    """The mapping of a space YAML file (checked by :func:`parse_space`)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"cannot read the space file {path}: {e.strerror}") from e
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of option names to ranges, e.g. "
                         f"\"lr: {{low: 1.0e-4, high: 0.1, log: true}}\"; got {type(values).__name__}")
    return values


def parse_space(mapping: dict, base: TrainConfig, source: str = "space") -> SearchSpace:
    """A checked :class:`SearchSpace` from a mapping of option names to ranges or choices.

    Args:
        mapping: as in the module doc, e.g. ``{"lr": {"low": 1e-4, "high": 0.1, "log": True}}``.
        base: the study's base config (unresolved); the options must apply to its strategy and layer kind.
        source: what the errors name (the file).

    Raises:
        ValueError: naming the option and what was expected, for an unknown option, an option of another
            strategy or layer kind, a malformed, empty or reversed range, a log range with low <= 0, empty
            choices, or a value the config refuses.
    """
    if not isinstance(mapping, dict) or not mapping:
        raise ValueError(f"{source}: expected a non-empty mapping of option names to ranges; got {mapping!r}")
    resolved = base.resolved()
    params = []
    for name, spec in mapping.items():
        where = f"{source}: {name!r}"
        layer_option = _check_name(name, resolved, where)
        params.append(_parse_param(name, spec, layer_option, where))
    space = SearchSpace(tuple(params))
    for param in space.params:
        _check_values(space, param, base, f"{source}: {param.name!r}")
    return space


def _check_name(name, resolved: TrainConfig, where: str) -> bool:
    """Whether ``name`` is a layer option (else a TrainConfig field); a ValueError if it is neither, may not be
    searched, or does not apply to the base config's strategy or layer kind."""
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    layer_options = [f.name for f in dataclasses.fields(KINDS[resolved.layer])]
    if not isinstance(name, str):
        raise ValueError(f"{where}: option names are strings; got {type(name).__name__}")
    if name in NOT_SEARCHABLE:
        raise ValueError(f"{where} cannot be searched: {NOT_SEARCHABLE[name]}")
    if name in fields:
        _check_strategy(name, resolved.strategy, where)
        return False
    if name in layer_options:
        if resolved.strategy == BACKPROP:
            raise ValueError(f"{where} is an option of layer kind {resolved.layer!r}, which strategy 'backprop' "
                             f"does not use")
        return True
    kinds = sorted(k for k, cls in KINDS.items() if name in [f.name for f in dataclasses.fields(cls)])
    if kinds:
        raise ValueError(f"{where} is an option of layer kind(s) {kinds}, not of the base config's layer "
                         f"{resolved.layer!r} (its options: {layer_options or 'none'}); set --layer {kinds[0]} "
                         f"or drop {name!r}")
    close = difflib.get_close_matches(name, fields + layer_options, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"{where}: unknown option; expected a TrainConfig option or an option of layer "
                     f"{resolved.layer!r} ({layer_options or 'none'}){hint}")


def _strategy_options(strategy: str) -> set[str]:
    """The strategy-specific options (``Strategy.config_options``) that ``strategy`` takes."""
    if strategy == BACKPROP:
        return {"weight_decay"} | set(BACKPROP_ONLY)
    return set(STRATEGIES[strategy].config_options)


def _check_strategy(name: str, strategy: str, where: str) -> None:
    """A ValueError if option ``name`` belongs to other strategies than ``strategy``."""
    owners = sorted(s for s, cls in STRATEGIES.items() if name in cls.config_options)
    if name in BACKPROP_ONLY:
        owners.append(BACKPROP)
    if strategy == BACKPROP and name in ES_ONLY:
        raise ValueError(f"{where} applies to the ES strategies, not to strategy 'backprop'; drop it or choose "
                         f"an ES strategy")
    if owners and name not in _strategy_options(strategy):
        raise ValueError(f"{where} applies to strategy {' or '.join(map(repr, owners))}, not to the base config's "
                         f"{strategy!r}; drop it or choose --strategy {owners[0]}")


def _number(value, where: str, key: str):
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


def _parse_param(name: str, spec, layer_option: bool, where: str) -> Param:
    expected = "{low: L, high: H[, log: true][, step: S]} or {choices: [...]}"
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"{where}: expected {expected}; got {spec!r}")
    if "choices" in spec:
        if set(spec) != {"choices"}:
            raise ValueError(f"{where}: choices go alone; got also {sorted(set(spec) - {'choices'})}")
        return Param(name, choices=_parse_choices(name, spec["choices"], where), layer_option=layer_option)
    unknown = sorted(set(spec) - set(RANGE_KEYS))
    if unknown or not {"low", "high"} <= set(spec):
        raise ValueError(f"{where}: expected {expected}; got keys {sorted(spec)}")
    low, high = _number(spec["low"], where, "low"), _number(spec["high"], where, "high")
    step = None if spec.get("step") is None else _number(spec["step"], where, "step")
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
        _check_step(low, high, step, where)
    if isinstance(low, int) and isinstance(high, int) and isinstance(step, float):
        raise ValueError(f"{where}: an int range (int low and high) needs an int step; got {step}")
    return Param(name, low, high, log, step, layer_option=layer_option)


def _check_step(low, high, step, where: str) -> None:
    if step <= 0:
        raise ValueError(f"{where}: step must be > 0; got {step}")
    count = (high - low) / step
    if abs(count - round(count)) > 1e-9 * max(1.0, count):
        raise ValueError(f"{where}: high - low must be a multiple of step; got low {low}, high {high}, step {step}")


def _parse_choices(name: str, choices, where: str) -> tuple[Value, ...]:
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"{where}: expected a non-empty list of choices; got {choices!r}")
    if name == "hidden":
        values = [hidden_text(parse_hidden(c, where)) for c in choices]
    else:
        floats = "float" in {f.name: f.type for f in dataclasses.fields(TrainConfig)}.get(name, "")
        values = [_choice(c, floats, where) for c in choices]
    duplicates = sorted({repr(v) for v in values if values.count(v) > 1})
    if duplicates:
        raise ValueError(f"{where}: choices must be distinct; got {', '.join(duplicates)} more than once")
    return tuple(values)


def _choice(value, floats: bool, where: str) -> Value:
    """A scalar choice; for a float option, YAML's "1e-3" string becomes a number."""
    if floats and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if value is not None and not isinstance(value, (bool, int, float, str)):
        raise ValueError(f"{where}: a choice must be a number, a string, a bool or null; got {value!r}")
    return value


def _check_values(space: SearchSpace, param: Param, base: TrainConfig, where: str) -> None:
    """Resolve the base config with each probe value of ``param``: a value the config refuses is an error now,
    not a failed trial later."""
    for value in param.probes():
        try:
            space.apply(base, {param.name: value}).resolved()
        except ValueError as e:
            raise ValueError(f"{where}: the value {value!r} is refused by the config: {e}") from None


# ----- defaults -----------------------------------------------------------------------------------------
def _around(factor: float) -> Callable[[TrainConfig, str], dict]:
    """A log-uniform range ``factor`` times either side of the base config's value."""
    def spec(cfg: TrainConfig, name: str) -> dict:
        value = getattr(cfg, name)
        return {"low": value / factor, "high": value * factor, "log": True}
    return spec


def _population(cfg: TrainConfig, name: str) -> dict:
    """p .. 4p in steps of p, p = half the population rounded down to even (at least 2)."""
    p = max(2, cfg.population // 4 * 2)
    return {"low": p, "high": 4 * p, "step": p}


def _widths(cfg: TrainConfig, name: str) -> dict | None:
    """Half, the same and twice the first hidden size, and two layers of it (a linear model: also "0")."""
    if cfg.model != "mlp":
        return None  # cnn channels and transformer shapes: give them in a --space
    w = cfg.hidden[0] if cfg.hidden else 16
    choices = [str(max(1, w // 2)), str(w), str(2 * w), f"{w},{w}"]
    return {"choices": (["0"] if not cfg.hidden else []) + choices}


def _halve_double(cfg: TrainConfig, name: str) -> dict:
    value = getattr(cfg, name)
    return {"choices": sorted({max(1, value // 2), value, 2 * value})}


def _fixed(spec: dict) -> Callable[[TrainConfig, str], dict]:
    return lambda cfg, name: spec


_ES = {"lr": _around(10), "sigma": _around(10), "population": _population, "rank": _fixed({"low": 1, "high": 8,
                                                                                              "log": True}),
       "hidden": _widths}
# per strategy: option -> its range as a function of the resolved base config (None: not searched there); a
# layer option (rank) is searched only when the base config's layer kind has it
DEFAULT_SPACES: dict[str, dict[str, Callable[[TrainConfig, str], dict | None]]] = {
    "openai_es": {**_ES, "weight_decay": _fixed({"low": 0.0, "high": 0.02})},
    "ars": dict(_ES),
    "pgpe": dict(_ES),
    BACKPROP: {"lr": _around(10), "weight_decay": _fixed({"low": 0.0, "high": 0.1}), "batch_size": _halve_double},
}


def default_space(base: TrainConfig) -> SearchSpace:
    """The default search space of the base config's strategy (:data:`DEFAULT_SPACES`), checked like a given
    one."""
    cfg = base.resolved()
    if cfg.strategy not in DEFAULT_SPACES:
        raise ValueError(f"no default search space for strategy {cfg.strategy!r} (defaults exist for "
                         f"{sorted(DEFAULT_SPACES)}); give one with --space")
    layer_options = [f.name for f in dataclasses.fields(KINDS[cfg.layer])]
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    mapping = {}
    for name, make in DEFAULT_SPACES[cfg.strategy].items():
        if name not in fields and name not in layer_options:
            continue
        spec = make(cfg, name)
        if spec is not None:
            mapping[name] = spec
    return parse_space(mapping, base, source="default space")


def make_space(base: TrainConfig, space: SearchSpace | dict | str | Path | None) -> SearchSpace:
    """A checked space from a :class:`SearchSpace`, a mapping, a YAML file, or None (the default space)."""
    if space is None:
        return default_space(base)
    if isinstance(space, SearchSpace):
        return parse_space(space.to_dict(), base)
    if isinstance(space, (str, Path)):
        return parse_space(read_space(space), base, source=str(space))
    return parse_space(space, base)


__all__ = ["DEFAULT_SPACES", "Param", "SearchSpace", "default_space", "make_space", "parse_space", "read_space"]
