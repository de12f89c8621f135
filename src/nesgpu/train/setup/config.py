"""Training configuration: one dataclass whose fields the CLI maps one to one; unset fields take the task's
defaults (:mod:`nesgpu.train.setup.defaults`), and every value is checked (:mod:`nesgpu.train.setup.validation`)."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ...layers.lowbit import NOISE_ON
from ...options import NoOptions, annotation_text, check_type
from ...precision import DTYPES, PRECISIONS
from ...quantize import BITS
from ...inplace import UPDATES
from ...strategies.schedules import SCHEDULES
from .ars_paper import PRESETS, preset_values
from .defaults import (
    BACKPROP,
    CUSTOM,
    TASK_DEFAULTS,
    chosen_strategy,
    compiles,
    is_supervised,
    kind_choices,
    preset_parts,
    presets,
    strategy_choices,
    torch_env_tasks,
    tuned_options,
)
from .initialization import INITS
from .component_options import (
    KEYS,
    STRATEGY,
    TASK,
    as_values,
    check_option_type,
    joined,
    read,
    sides,
    split,
    task_key,
    with_named,
)
from .validation import check_hidden_applies, check_strategy_options, validate


def option_names() -> list[str]:
    """Every option a config file names: the run's own fields, then every strategy's and every task's."""
    run = [f.name for f in dataclasses.fields(TrainConfig) if not f.metadata.get("component")]
    return list(dict.fromkeys([*run, *STRATEGY.names(), *TASK.names()]))


def option_type(name: str) -> str:
    """The annotation of option ``name`` as text (a component's: as its first owner declares it)."""
    field = TrainConfig.__dataclass_fields__.get(name) or STRATEGY.field(name) or TASK.field(name)
    return "" if field is None else annotation_text(field.type)


def field_defaults() -> dict:
    """Every TrainConfig field's default (a fresh one for fields with a default factory)."""
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(TrainConfig)}


def opt(default=None, help: str = "", **cli):
    """A TrainConfig field: its default, a one-line doc, and what the CLI needs beyond its type (``choices``,
    ``metavar``, ``flag`` for another flag name, ``parse`` for a custom parser, ``per_task`` when None means
    the task's default)."""
    factory = {"default_factory": default} if callable(default) else {"default": default}
    return field(**factory, metadata={"help": help, **cli})


@dataclass
class TrainConfig:
    """Everything a run needs: the one source of the training options. ``nesgpu train``'s flags are
    generated from these fields (``--time-budget`` for ``time_budget``), and YAML/JSON configs use the same
    names. ``None`` means "the task's default" (see :func:`presets` and TASK_DEFAULTS).

    Beside the run's own fields below, the chosen strategy's and the chosen task's options (``top_b`` of ars,
    ``shaping`` of openai_es and pgpe, ``optimizer`` of backprop, ``batch_size`` of the supervised tasks,
    ``episodes`` of the RL tasks, ...) are held in ``strategy_options`` and ``task_options``: a dict of those
    given (``TrainConfig(task="cartpole", task_options={"episodes": 3})``), then, once resolved, the
    component's own ``Options`` (``cfg.task_options.episodes``). Unset ones take the owner's default (or the
    task's tuned value), and one set under another strategy or task is an error. Config files name them flat
    (``episodes: 3``, :meth:`from_dict`), or under their side where the chosen strategy and task both take a name
    (:mod:`~nesgpu.train.setup.component_options`); :meth:`option` reads any option by name and
    :meth:`with_options` sets any."""

    task: str = opt("digits", "the task: digits, cartpole, gym:<id>, generation (your reward), ...")
    strategy: str | None = opt(help="the ES algorithm, or backprop (supervised tasks)",
                               per_task=True, choices=strategy_choices)
    layer: str | None = opt(help="perturbation kind of the matrices", choices=kind_choices, per_task=True)
    model: str | None = opt(help="architecture: mlp; mnist1d also cnn (Conv1d); reverse, sort: transformer; "
                            "the language-model tasks: hf:DIR (a local Hugging Face model directory)",
                            per_task=True)
    population: int | None = opt(help="members per step, both signs counted", per_task=True)
    sigma: float | str | None = opt(help="noise scale, or auto: probed from the model's response", per_task=True,
                                    parse="auto", metavar="S|auto")
    lr: float | str | None = opt(help="step size, or auto: the strategy's rule from sigma (another strategy than "
                                 "the task's: its own)", per_task=True, parse="auto", metavar="LR|auto")
    steps: int | None = opt(help="ES steps", per_task=True)
    seed: int = opt(0, "seed of the weights, the noise and the data")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    out: str | None = opt(help="run directory (default: a new runs/<task>[-N])")
    hidden: tuple[int, ...] | None = opt(help="hidden sizes, e.g. 64,64 (0: none; cnn: channels; transformer: "
                                         "d_model,layers,heads,ffn)", per_task=True, metavar="N,N")
    antithetic: bool | None = opt(help="each direction at +sigma and -sigma (default on; off for cma_es, "
                                       "sep_cma_es)")
    layer_options: dict = opt(dict, "options of the layer kind (each also a flag of its own, e.g. --rank)")
    bits: int | None = opt(help="low-bit weights in every Linear and Conv layer: 1 (binary) or 8 (int8), each with a "
                           "per-output-channel scale, quantised from the float weights ES updates (default: float; "
                           "models mlp and cnn)", choices=BITS)
    noise_on: str = opt("latent", "with --bits: perturb the float weights, then quantise each member (latent), or add "
                        "the noise to the shared quantised weights (quantized)", choices=NOISE_ON)
    act_bits: int | None = opt(help="with --bits: 8 quantises every Linear's input rows to int8 and runs the shared "
                               "low-bit product as an int8 GEMM (model mlp; default: float inputs)", choices=(8,))
    evolve: str = opt("all", "all trainable parameters (default), or only matrices (linear, attention, "
                      "embedding, conv)", choices=("all", "matrices"))
    anchor: float = opt(0.0, "after every step, w -= anchor * (w - w_start) (default 0: off; below 1)")
    sigma_schedule: str = opt("constant", "sigma over the steps", choices=SCHEDULES)
    sigma_final: float = opt(1.0, "sigma factor at the last step")
    lr_schedule: str | None = opt(help="lr over the steps", choices=SCHEDULES, per_task=True)
    lr_final: float | None = opt(help="lr factor at the last step", per_task=True)
    eval_every: int = opt(0, "steps between evaluations (default 0: a tenth of the run)")
    eval_seconds: float = opt(0.0, "also evaluate every this many seconds (default 0: by steps only, or a tenth "
                              "of --time-budget)")
    time_budget: float | None = opt(help="stop, as finished, after this many seconds of training")
    log: str | None = opt(help="trackers, comma-separated: tensorboard, wandb, mlflow, or none (default: "
                          "tensorboard if installed)")
    progress_every: float = opt(30.0, "seconds between progress lines off a terminal (default 30; 0: none)")
    target: float | None = opt(help="stop once the evaluated metric reaches it (gym: its reward_threshold)")
    checkpoint_every: int = opt(0, "steps between checkpoints (default 0: a tenth of the run)")
    chunk_size: int | str | None = opt(help="evaluate N directions at a time (auto: the most that fit; default: "
                                       "all)", metavar="N|auto", parse="chunk")
    precision: str = opt("fp32", "population forward under autocast", choices=tuple(PRECISIONS))
    dtype: str | None = opt(help="the weights' dtype (default: the model's)", choices=DTYPES)
    update: str | None = opt(help="sgd, adam: in place (no .grad or master); strategy: its optimizer",
                             choices=UPDATES, per_task=True)
    preset: str | None = opt(help="a published setting: ars-paper (ARS V2-t's alpha, N, b, nu, shift and "
                             "threshold for gym:HalfCheetah/Hopper/Walker2d/Ant/Humanoid-v5); it expands into the "
                             "options it sets, except those given explicitly", choices=PRESETS)
    compile: str = opt("auto", "torch.compile env steps (auto: from 20M) or decode (auto: off)",
                       choices=("auto", "on", "off"))
    init: str = opt("default", "initial Linear and Conv weights: torch's (default), he or xavier; biases zero",
                    choices=INITS)
    dist_timeout: float = opt(300.0, "torchrun: seconds before a hung collective fails")
    strategy_options: object = opt(dict, "the strategy's options: a dict of those given, by name, or its Options "
                                   "(taken whole; built when the config is resolved)", component=True)
    task_options: object = opt(dict, "the task's options: a dict of those given, by name, or its Options (taken "
                               "whole; built when the config is resolved)", component=True)

    def __new__(cls, *args, **kwargs):
        """Refuse a component's option passed by name (``TrainConfig(episodes=3)``), saying where it goes."""
        named = next((k for k in kwargs if k not in cls.__dataclass_fields__ and sides(k)), None)
        if named is not None:
            owners = sides(named)
            where = " or ".join(f"{KEYS[o.kind]}={{{named!r}: ...}}" for o in owners)
            raise TypeError(f"TrainConfig got {named!r}, an option of a {' and of a '.join(o.kind for o in owners)}: "
                            f"give it as {where}, or by name through TrainConfig.flat(...)")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for key, owners in (("strategy_options", STRATEGY), ("task_options", TASK)):
            with_named(getattr(self, key), {}, owners)  # a dict of another side's options: a TypeError

    def option(self, name: str):
        """Option ``name``, the run's or a component's (``cfg.option("top_b")``): a component's is None when it is
        not set or not the chosen component's. A name that is no option is a ValueError."""
        if name in self.__dataclass_fields__:
            return getattr(self, name)
        if not sides(name):
            raise ValueError(f"unknown option {name!r}; expected one of {sorted(option_names())}")
        found = {o.kind: read(getattr(self, KEYS[o.kind]), name) for o in sides(name)}
        found = {kind: value for kind, value in found.items() if value is not None}
        if len(found) > 1:
            raise ValueError(f"option {name!r} is set for the strategy and for the task: read cfg.strategy_options or "
                             f"cfg.task_options")
        return next(iter(found.values()), None)

    def with_options(self, **named) -> TrainConfig:
        """A copy with the options ``named`` set: the run's, the components' by name (each into its side's
        options, checked again, or resolved again when the config is), and ``strategy_options`` /
        ``task_options`` mappings, whose entries are set on that side."""
        run = {k: named.pop(k) for k in list(named) if k in self.__dataclass_fields__ and k not in KEYS.values()}
        explicit = {key: as_values(named.pop(key)) for key in KEYS.values() if key in named}
        unknown, strategy, options = split(named, *_routing({"task": self.task, "strategy": self.strategy,
                                                             "preset": self.preset, **run}), "TrainConfig")
        if unknown:
            raise TypeError(f"TrainConfig got an unknown option {next(iter(unknown))!r}; expected a run option or an "
                            f"option of a strategy ({', '.join(STRATEGY.names())}) or a task ({', '.join(TASK.names())})")
        for key, given, owners in (("strategy_options", strategy, STRATEGY), ("task_options", options, TASK)):
            run[key] = with_named(getattr(self, key), {**explicit.get(key, {}), **given}, owners)
        return dataclasses.replace(self, **run)

    @classmethod
    def flat(cls, **values) -> TrainConfig:
        """A config of options given flat, by name (``TrainConfig.flat(task="cartpole", episodes=3)``): the
        run's, and each component's into its side's options."""
        run = {k: values.pop(k) for k in list(values) if k in cls.__dataclass_fields__ and k not in KEYS.values()}
        return cls(**run).with_options(**values)

    def __eq__(self, other) -> bool:
        """Equal options, whether the components' are given by name or built (one given as None is unset)."""
        if not isinstance(other, TrainConfig):
            return NotImplemented
        return _set(self) == _set(other)

    def parts(self) -> tuple[dict, dict, dict]:
        """The options as three mappings: the run's, the strategy's and the task's (those given, by name)."""
        run = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
               if not f.metadata.get("component")}
        return run, as_values(self.strategy_options), as_values(self.task_options)

    def to_dict(self) -> dict:
        """The options as config files and config.json hold them: the run's, then the strategy's and the task's
        by name (:func:`~nesgpu.train.setup.component_options.joined`)."""
        return joined(*self.parts())

    def resolved(self) -> TrainConfig:
        """A copy with the task's presets filled in and the strategy's and task's Options built, validated. (A
        ``preset`` was expanded when the config was built; one set afterwards, ``cfg.preset = ...``, sets the
        options still at their defaults.)"""
        run, strategy, options = self.parts()
        if self.preset is not None:
            defaults = field_defaults()
            given = {name for name, value in run.items() if value != defaults.get(name)}
            expand_preset(run, strategy, options, given | {k for k, v in {**strategy, **options}.items()
                                                           if v is not None})
        own_run, own_strategy, own_task = preset_parts(run["task"], run["model"], run["strategy"])
        if run.get("update") not in (None, own_run.get("update")) and run.get("lr") is None:
            run["lr"] = "auto"  # the task's step size was tuned for its own optimizer: the other's rule
        check_hidden_applies(run)
        check_strategy_options(run, strategy, own_run["strategy"], field_defaults(), own_run,
                               tuned_options(run["task"]))
        # what RL runs resolve to (a printed config of one) and ars's clip, which older runs recorded for every task
        TASK.drop_foreign(options, task_key(run["task"]), allowed={"observation_clip": 0.0, "policy_output": "tanh"})
        for given, defaults in ((run, own_run), (strategy, own_strategy), (options, own_task)):
            given.update({name: value for name, value in defaults.items() if given.get(name) is None})
        run["hidden"] = tuple(run["hidden"])
        cfg = TrainConfig(**run, strategy_options=STRATEGY.options_of(run["strategy"], strategy),
                          task_options=_task_options(run, options))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check every value of a resolved config; a ValueError names the option, the value and what was
        expected."""
        validate(self)

    @property
    def directions(self) -> int:
        return self.population // 2 if self.antithetic else self.population

    @classmethod
    def with_preset(cls, preset: str, **options) -> TrainConfig:
        """A config of ``preset``'s settings (``"ars-paper"``: see :mod:`nesgpu.train.setup.ars_paper`) for
        ``options["task"]``, with the ``options`` given here keeping their values, even one equal to its
        default. (``TrainConfig(preset=...)`` expands when resolved, over the options still at their
        defaults.)"""
        run, strategy, given = cls.flat(**options, preset=preset).parts()
        expand_preset(run, strategy, given, set(options) | set(strategy) | set(given))
        return cls(**run, strategy_options=strategy, task_options=given)

    # ----- files -------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> TrainConfig:
        """A config from a mapping of options (a YAML file's, a run's config.json): the run's own, and the
        strategy's and the task's by name or in ``strategy_options`` and ``task_options`` mappings
        (:func:`~nesgpu.train.setup.component_options.split`); a ``preset`` there expands over the options the
        mapping does not set."""
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("component")}
        run, strategy, options = split(values, *_routing(values), source)
        unknown = sorted(name for name in run if name not in fields)
        if unknown:
            raise ValueError(f"{source}: unknown option(s) {unknown}; expected a subset of {sorted(option_names())}")
        for name, value in run.items():
            check_type(name, value, fields[name].type, source)
            if fields[name].metadata.get("parse") == "auto" and isinstance(value, str) and value != "auto":
                raise ValueError(f"{source}: option {name!r} must be a number or 'auto'; got {value!r}")
        for owners, part in ((STRATEGY, strategy), (TASK, options)):
            for name, value in part.items():
                check_option_type(owners, name, value, source)
        if run.get("hidden") is not None:
            run["hidden"] = tuple(run["hidden"])
        if run.get("preset") is not None:
            expand_preset(run, strategy, options, (set(run) | set(strategy) | set(options)) - {"preset"})
        return cls(**run, strategy_options=strategy, task_options=options)

    @classmethod
    def from_layers(cls, *layers: dict, source: str = "options") -> TrainConfig:
        """A config from mappings of options (a resumed run's, a config file's, the flags'), each over the ones
        before it: a side's options are merged by name (:meth:`from_dict`)."""
        chosen = _routing({key: value for layer in layers for key, value in layer.items()})
        parts: tuple[dict, dict, dict] = ({}, {}, {})
        for layer in layers:
            for part, given in zip(parts, split(layer, *chosen, source)):
                part.update(given)
        return cls.from_dict(joined(*parts), source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """A config from a YAML (or JSON) file of options; unknown or mistyped options name the field."""
        return cls.from_dict(cls.read_yaml(path), source=str(path))

    @classmethod
    def read_yaml(cls, path: str | Path) -> dict:
        """The options a YAML (or JSON) file sets, checked against the fields (as from_dict does)."""
        from .yaml_file import read_yaml_file

        values = read_yaml_file(path) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of options; got {type(values).__name__}")
        for part in (values, *(values[key] for key in KEYS.values() if isinstance(values.get(key), dict))):
            for name, value in part.items():  # YAML 1.1 reads 1e-3 (no dot) as a string
                if isinstance(value, str) and "float" in option_type(name):
                    try:
                        part[name] = float(value)
                    except ValueError:
                        pass
        cls.from_dict(values, source=str(path))  # names any unknown or mistyped option
        return values

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_yaml(self) -> str:
        """The options as YAML that ``--config`` reads back (``nesgpu train --print-config``)."""
        import yaml

        values = {k: list(v) if isinstance(v, tuple) else v for k, v in self.to_dict().items()}
        return yaml.safe_dump(values, sort_keys=False)


def _routing(values: dict) -> tuple[str | None, str]:
    """The strategy and the task a config mapping chooses (for :func:`~nesgpu.train.setup.component_options.route`):
    its own, else its preset's strategy, else the task's; the default task."""
    task = values.get("task") if isinstance(values.get("task"), str) else "digits"
    strategy = values.get("strategy") if isinstance(values.get("strategy"), str) else None
    if strategy is None and isinstance(values.get("preset"), str):
        try:
            strategy = preset_values(values["preset"], task).get("strategy")
        except ValueError:  # an unknown preset: named when the preset expands
            pass
    return chosen_strategy(task, strategy), task


def _set(cfg: TrainConfig) -> tuple:
    """The options of ``cfg``: the run's, and the components' that are not None (unset)."""
    run, strategy, options = cfg.parts()
    return run, {k: v for k, v in strategy.items() if v is not None}, {k: v for k, v in options.items() if v is not None}


def _task_options(run: dict, values: dict):
    """The task's Options from the config's ``values`` of them, settled for the run's strategy and hidden
    layers (``for_run``: an RL task's policy_output auto); a task of your own takes none here."""
    key = task_key(run["task"])
    if key is None:
        return NoOptions()
    options = TASK.options_of(key, values)
    for_run = getattr(options, "for_run", None)
    strategy = None if run["strategy"] == BACKPROP else run["strategy"]
    return options if for_run is None else for_run(strategy, run["hidden"])


def expand_preset(run: dict, strategy: dict, options: dict, given) -> None:
    """Set, in a config's ``run``, ``strategy`` and ``options`` (the task's) options, those ``run["preset"]``
    sets that are not in ``given`` (an option given explicitly keeps its value, even one equal to its default);
    the preset is then spent (None)."""
    task = run.get("task", "digits")
    values = preset_values(run["preset"], task)
    chosen = run.get("strategy") if "strategy" in given else values.get("strategy", run.get("strategy"))
    for part, new in zip((run, strategy, options), split(values, chosen_strategy(task, chosen), task,
                                                         f"preset {run['preset']!r}")):
        part.update({name: value for name, value in new.items() if name not in given})
    run["preset"] = None


__all__ = ["BACKPROP", "CUSTOM", "TASK_DEFAULTS", "TrainConfig", "compiles", "is_supervised", "option_names",
           "option_type", "presets", "torch_env_tasks"]
