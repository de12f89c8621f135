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
| lr | log-uniform, value / 10 .. value * 10 (auto: 1e-5 .. 0.1) | all |
| sigma | log-uniform, value / 10 .. value * 10 (auto: the probe's grid, 1e-4 .. 1) | ES |
| population | int, p .. 4p in steps of p, p = population / 2 (rounded down to even) | ES |
| weight_decay | uniform 0 .. 0.02 (openai_es), 0 .. 0.1 (backprop) | openai_es, backprop |
| rank | int, log-uniform 1 .. 8 (layer lowrank only) | ES |
| hidden | choices w/2, w, 2w, "w,w" (w: the first hidden size; a linear model: w = 16, and "0") | ES, model mlp only |
| batch_size | choices b/2, b, 2b | backprop |

A strategy with a limit on the evolving parameters (cma_es, xnes) searches only the hidden sizes whose model fits
it, and a base config whose model exceeds it is refused before the study.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..layers import KINDS
from ..probe import GRID
from ..strategies import STRATEGIES
from ..train.setup.config import TrainConfig, option_names
from ..train.setup.defaults import BACKPROP, ES_ONLY
from ..train.setup.component_options import STRATEGY
from .params import Param, Value, hidden_text, parse_hidden, parse_param  # noqa: F401 (re-exported)

# options a space may not search, and why
NOT_SEARCHABLE = {
    "out": "each trial runs in DIR/trials/NNNN",
    "layer_options": "search a layer option by its own name, e.g. rank",
    "task": "the metrics of different tasks do not compare",
}


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
        return base.with_options(**fields, layer_options={**base.layer_options, **options})

    def categorical(self) -> list[str]:
        return [p.name for p in self.params if p.kind == "categorical"]

    def to_dict(self) -> dict[str, dict]:
        """The space as the YAML mapping ``--space`` reads (``nesgpu tune --print-space``)."""
        return {p.name: p.to_dict() for p in self.params}


def config_value(name: str, value: Value):
    """A trial's value as the TrainConfig field takes it: hidden "64,64" becomes (64, 64), "0" ()."""
    return parse_hidden(value, name) if name == "hidden" else value


def read_space(path: str | Path) -> dict:
    """The mapping of a space YAML file (checked by :func:`parse_space`)."""
    from ..train.setup.yaml_file import read_yaml_file

    values = read_yaml_file(path, "space file")
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
        params.append(parse_param(name, spec, layer_option, where))
    space = SearchSpace(tuple(params))
    for param in space.params:
        _check_values(space, param, base, f"{source}: {param.name!r}")
    return space


def _check_name(name, resolved: TrainConfig, where: str) -> bool:
    """Whether ``name`` is a layer option (else a TrainConfig field); a ValueError if it is neither, may not be
    searched, or does not apply to the base config's strategy or layer kind."""
    fields = option_names()
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


def _check_strategy(name: str, strategy: str, where: str) -> None:
    """A ValueError if option ``name`` belongs to other strategies than ``strategy``."""
    if strategy == BACKPROP and name in ES_ONLY:
        raise ValueError(f"{where} applies to the ES strategies, not to strategy 'backprop'; drop it or choose "
                         f"an ES strategy")
    theirs = STRATEGY.owners(name)
    if theirs and name not in STRATEGY.defaults_of(strategy):
        raise ValueError(f"{where} applies to strategy {' or '.join(map(repr, theirs))}, not to the base config's "
                         f"{strategy!r}; drop it or choose --strategy {theirs[0]}")


def _check_values(space: SearchSpace, param: Param, base: TrainConfig, where: str) -> None:
    """Resolve the base config with each probe value of ``param``: a value the config refuses is an error now,
    not a failed trial later."""
    for value in param.probes():
        try:
            space.apply(base, {param.name: value}).resolved()
        except ValueError as e:
            raise ValueError(f"{where}: the value {value!r} is refused by the config: {e}") from None


# ----- defaults -----------------------------------------------------------------------------------------
AUTO_RANGES = {"sigma": (GRID[0], GRID[-1]), "lr": (1e-5, 0.1)}  # what "auto" is searched over


def _around(factor: float) -> Callable[[TrainConfig, str], dict]:
    """A log-uniform range ``factor`` times either side of the base config's value."""
    def spec(cfg: TrainConfig, name: str) -> dict:
        value = cfg.option(name)
        if value == "auto":  # probed at each trial's start: searched over the probe's own range instead
            return {"low": AUTO_RANGES[name][0], "high": AUTO_RANGES[name][1], "log": True}
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
    value = cfg.option(name)
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
    # an ES strategy without an entry of its own (a new one) is searched over the shared ES options
    spaces = DEFAULT_SPACES.get(cfg.strategy, _ES if cfg.strategy in STRATEGIES else None)
    if spaces is None:
        raise ValueError(f"no default search space for strategy {cfg.strategy!r} (defaults exist for "
                         f"{sorted(DEFAULT_SPACES)}); give one with --space")
    layer_options = [f.name for f in dataclasses.fields(KINDS[cfg.layer])]
    fields = set(option_names())
    mapping = {}
    for name, make in spaces.items():
        if name not in fields and name not in layer_options:
            continue
        spec = make(cfg, name)
        if spec is not None:
            mapping[name] = spec
    if STRATEGIES.get(cfg.strategy) is not None and STRATEGIES[cfg.strategy].max_parameters is not None:
        _fit(cfg, mapping)
    return parse_space(mapping, base, source="default space")


def _fit(cfg: TrainConfig, mapping: dict) -> None:
    """A strategy with a limit on the evolving parameters (cma_es, xnes): the hidden sizes whose model exceeds it
    are left out of ``mapping``; a base model above it is refused now, in one line, not in every trial."""
    import torch

    from ..model import PerturbedModel
    from ..train.setup.build import config_task, initial_model, perturbed

    limit, task = STRATEGIES[cfg.strategy].max_parameters, config_task(cfg, torch.device("cpu"))

    def evolving(hidden) -> int:
        model = perturbed(cfg, initial_model(dataclasses.replace(cfg, hidden=hidden), task))
        return PerturbedModel(model, 2, sigma=0.1).num_perturbed

    count = evolving(cfg.hidden)
    if count > limit:
        raise ValueError(f"strategy {cfg.strategy!r} takes models of up to {limit:,} evolving parameters; the base "
                         f"config's has {count:,}, so every trial would be refused: give a smaller --hidden (or "
                         f"--model), or another strategy")
    if "hidden" in mapping:
        choices = [c for c in mapping["hidden"]["choices"] if evolving(parse_hidden(c, "hidden")) <= limit]
        mapping["hidden"] = {"choices": choices}


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
