"""Training configuration: one dataclass whose fields the CLI maps one to one; unset fields take the task's
defaults (:mod:`nesgpu.train.setup.defaults`), and every value is checked (:mod:`nesgpu.train.setup.validation`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ...layers import KINDS
from ...layers.lowbit import NOISE_ON
from ...options import check_type
from ...precision import DTYPES, PRECISIONS
from ...quantize import BITS
from ...strategies import STRATEGIES
from ...strategies.schedules import KINDS as SCHEDULES
from .ars_paper import PRESETS, preset_values
from .defaults import (
    BACKPROP,
    CUSTOM,
    ES_ONLY,
    GLOBAL_DEFAULTS,
    STRATEGY_CHOICES,
    TASK_DEFAULTS,
    compiles,
    is_supervised,
    presets,
    torch_env_tasks,
    tuned_options,
)
from .initialization import INITS
from .options import STRATEGY, TASK, task_key
from .validation import check_hidden_applies, check_strategy_options, validate


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


def _with_component_options(cls):
    """``cls`` with a field per strategy option and per task option (every strategy's ``Options``,
    backprop's too, and every built-in task's; see :mod:`nesgpu.train.setup.options`), each None by default:
    its owner's own value."""
    strategies, tasks = STRATEGY.config_fields(), TASK.config_fields()
    shared = {name for name, _, _ in strategies} & {name for name, _, _ in tasks}
    if shared:
        raise TypeError(f"options {sorted(shared)} are declared by a strategy and by a task; rename one")
    return dataclasses.make_dataclass(cls.__name__, strategies + tasks, bases=(cls,),
                                      namespace={"__doc__": cls.__doc__, "__module__": cls.__module__,
                                                 "__qualname__": cls.__qualname__})


@_with_component_options
@dataclass
class TrainConfig:
    """Everything a run needs: the one source of the training options. ``nesgpu train``'s flags are
    generated from these fields (``--batch-size`` for ``batch_size``), and YAML/JSON configs use the same
    names. ``None`` means "the task's default" (see :func:`presets` and TASK_DEFAULTS).

    Besides the fields below, every option of every strategy and of every built-in task is a field of its own
    (``top_b`` of ars, ``shaping`` of openai_es and pgpe, ``optimizer`` of backprop, ``batch_size`` of the
    supervised tasks, ``episodes`` of the RL tasks, ...): each strategy's and task's ``Options`` declare them;
    None takes the owner's default (or the task's tuned value), and one set under another strategy or task is an
    error."""

    task: str = opt("digits", "digits | mnist1d | reverse | sort | cartpole | pendulum | acrobot | mountaincar | "
                    "gym:<id> | arithmetic | countdown | generation (a language model on a reward, --model hf:DIR; "
                    "generation: your --prompts and --reward)")
    strategy: str | None = opt(help="the ES algorithm, or backprop: the gradient baseline (supervised tasks)",
                               choices=STRATEGY_CHOICES, per_task=True)
    layer: str = opt("lowrank", "perturbation kind of the model's matrices", choices=tuple(sorted(KINDS)))
    model: str | None = opt(help="architecture: mlp; mnist1d also cnn (Conv1d); reverse, sort: transformer; "
                            "arithmetic, countdown: hf:DIR (a local Hugging Face model directory)", per_task=True)
    population: int | None = opt(help="members per step, both signs counted", per_task=True)
    sigma: float | str | None = opt(help="noise scale, or auto: probed before the first step, the sigma at which "
                                    "the members' fitness spreads (nesgpu.probe)", per_task=True, parse="auto",
                                    metavar="S|auto")
    lr: float | str | None = opt(help="step size, or auto: the strategy's rule from sigma (openai_es: sigma / 10, "
                                 "ars: sigma / 2); another strategy than the task's starts from its own default",
                                 per_task=True, parse="auto", metavar="LR|auto")
    steps: int | None = opt(help="ES steps", per_task=True)
    seed: int = opt(0, "seed of the initial weights, the noise and the data")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    out: str | None = opt(help="run directory (default: a new runs/<task>, runs/<task>-2, ...)")
    hidden: tuple[int, ...] | None = opt(help="hidden sizes, e.g. 64,64; 0 for a linear model; cnn: channels per "
                                         "Conv1d; transformer: d_model[,n_layers[,n_heads[,dim_feedforward]]]",
                                         per_task=True, metavar="N,N")
    antithetic: bool | None = opt(help="mirrored sampling: each direction evaluated at +sigma and -sigma (default "
                                       "on; off for sep_cma_es and cma_es, whose members are independent)")
    layer_options: dict = opt(dict, "options of the layer kind (each also a flag of its own, e.g. --rank)")
    bits: int | None = opt(help="low-bit weights in every Linear and Conv layer: 1 (binary) or 8 (int8), each with a "
                           "per-output-channel scale, quantised from the float weights ES updates (default: float; "
                           "models mlp and cnn)", choices=BITS)
    noise_on: str = opt("latent", "with --bits: perturb the float weights, then quantise each member (latent), or add "
                        "the noise to the shared quantised weights (quantized)", choices=NOISE_ON)
    act_bits: int | None = opt(help="with --bits: 8 quantises every Linear's input rows to int8 and runs the shared "
                               "low-bit product as an int8 GEMM (model mlp; default: float inputs)", choices=(8,))
    evolve: str = opt("all", "what ES evolves: every trainable parameter (all), or only the weight matrices "
                      "(matrices: linear, attention, embedding and conv weights; norms and biases stay as they are)",
                      choices=("all", "matrices"))
    anchor: float = opt(0.0, "after every step, pull the evolving weights toward the starting model's: w -= anchor "
                        "* (w - w_start), the starting weights kept in the checkpoint (0: off; below 1)")
    sigma_schedule: str = opt("constant", "sigma over the steps", choices=SCHEDULES)
    sigma_final: float = opt(1.0, "sigma factor at the last step")
    lr_schedule: str | None = opt(help="lr over the steps", choices=SCHEDULES, per_task=True)
    lr_final: float | None = opt(help="lr factor at the last step", per_task=True)
    eval_every: int = opt(0, "steps between evaluations, after the one at step 0 (0: a tenth of the run)")
    eval_seconds: float = opt(0.0, "also evaluate once this many seconds have passed since the last evaluation "
                              "(0: by steps only; with --time-budget and no --eval-every, a tenth of the budget)")
    time_budget: float | None = opt(help="stop once training has run this many seconds (the run ends as a "
                                    "finished one, at that step)")
    log: str | None = opt(help="experiment trackers, comma-separated: tensorboard, wandb, mlflow; none for no "
                          "tracker (default: tensorboard when installed)")
    progress_every: float = opt(30.0, "seconds between progress lines when stderr is no terminal (0: none)")
    target: float | None = opt(help="stop once the evaluated metric reaches it (gym tasks: the env's "
                               "reward_threshold by default)")
    checkpoint_every: int = opt(0, "steps between checkpoints (0: a tenth of the run)")
    chunk_size: int | str | None = opt(help="evaluate the population in blocks of N directions (auto: the "
                                       "largest that fits; default: all at once)", metavar="N|auto",
                                       parse="chunk")
    precision: str = opt("fp32", "population forward under autocast", choices=tuple(PRECISIONS))
    dtype: str | None = opt(help="ES: the dtype the model's weights are held in (default: the model's own; a "
                            "Hugging Face model is loaded in it); below float32 the population runs in it and "
                            "float32 master weights take the updates", choices=DTYPES)
    preset: str | None = opt(help="a published setting: ars-paper (ARS V2-t's alpha, N, b, nu, shift and "
                             "threshold for gym:HalfCheetah/Hopper/Walker2d/Ant/Humanoid-v5); it expands into the "
                             "options it sets, except those given explicitly", choices=PRESETS)
    compile: str = opt("auto", "torch.compile: built-in RL envs compile each env step with the population forward "
                       "(auto: on when the run makes >= 20M env steps, where the seconds of compiling pay); "
                       "generation tasks compile the population generate()'s decode with a static KV cache (auto: "
                       "off)",
                       choices=("auto", "on", "off"))
    init: str = opt("default", "initial weights of Linear and Conv layers: torch's default, he (Kaiming normal) or "
                    "xavier (Glorot uniform); biases zero", choices=INITS)
    dist_timeout: float = opt(300.0, "torchrun: seconds before a collective with a dead or hung process fails")

    def resolved(self) -> TrainConfig:
        """A copy with the task's presets filled in, validated. (A ``preset`` was expanded when the config was
        built; one set afterwards, ``cfg.preset = ...``, sets the options still at their defaults.)"""
        values = dataclasses.asdict(self)
        if self.preset is not None:
            defaults = field_defaults()
            expand_preset(values, {name for name, value in values.items() if value != defaults[name]})
        defaults = presets(values["task"], values["model"], values["strategy"])
        check_hidden_applies(values)
        check_strategy_options(values, defaults["strategy"], field_defaults(), defaults, tuned_options(values["task"]))
        # what RL runs resolve to (a printed config of one) and ars's clip, which older runs recorded for every task
        TASK.drop_foreign(values, task_key(values["task"]), allowed={"observation_clip": 0.0, "policy_output": "tanh"})
        for name, value in defaults.items():
            if values.get(name) is None:
                values[name] = value
        values["hidden"] = tuple(values["hidden"])
        if values["policy_output"] == "auto":  # an RL task's
            own = STRATEGIES.get(values["strategy"])  # None for the gradient baseline
            linear = own is not None and own.linear_policy and not values["hidden"]
            values["policy_output"] = "linear" if linear else "tanh"
        cfg = TrainConfig(**values)
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
        values = {"preset": preset, **options}
        expand_preset(values, set(options))
        return cls(**values)

    # ----- files -------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> TrainConfig:
        """A config from a mapping of options (a YAML file's, a run's config.json); a ``preset`` there
        expands over the options the mapping does not set."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"{source}: unknown option(s) {unknown}; expected a subset of {sorted(names)}")
        values = dict(values)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in values.items():
            check_type(name, value, fields[name].type, source)
            if fields[name].metadata.get("parse") == "auto" and isinstance(value, str) and value != "auto":
                raise ValueError(f"{source}: option {name!r} must be a number or 'auto'; got {value!r}")
        if values.get("hidden") is not None:
            values["hidden"] = tuple(values["hidden"])
        if values.get("preset") is not None:
            expand_preset(values, set(values) - {"preset"})
        return cls(**values)

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
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for name, value in values.items():  # YAML 1.1 reads 1e-3 (no dot) as a string
            if isinstance(value, str) and "float" in types.get(name, ""):
                try:
                    values[name] = float(value)
                except ValueError:
                    pass
        cls.from_dict(values, source=str(path))  # names any unknown or mistyped option
        return values

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    def to_yaml(self) -> str:
        """The options as YAML that ``--config`` reads back (``nesgpu train --print-config``)."""
        import yaml

        values = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        return yaml.safe_dump(values, sort_keys=False)


def expand_preset(values: dict, given) -> None:
    """Set, in ``values``, the options ``values["preset"]`` sets that are not in ``given`` (an option given
    explicitly keeps its value, even one equal to its default); the preset is then spent (None)."""
    for name, value in preset_values(values["preset"], values.get("task", "digits")).items():
        if name not in given:
            values[name] = value
    values["preset"] = None


def custom_label(task) -> str:
    """The task name a run of the user's own ``task`` records: ``custom:<its name or class name>``."""
    return f"{CUSTOM}{getattr(task, 'name', None) or type(task).__name__}"


def labelled(cfg: TrainConfig, task) -> TrainConfig:
    """``cfg`` for a run of the user's own ``task`` object: labelled ``custom:<its name>`` (unless it is
    already) and with the task's ``defaults`` mapping, if it has one, in the options left unset (None)."""
    name = getattr(task, "name", None) or type(task).__name__
    label = cfg.task if cfg.task.startswith(CUSTOM) else custom_label(task)
    defaults = getattr(task, "defaults", None) or {}
    if not isinstance(defaults, dict):
        raise TypeError(f"a task's defaults must be a dict of TrainConfig options; got {type(defaults).__name__}")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(defaults) - fields)
    if unknown:
        raise ValueError(f"task {name!r}: defaults {unknown} are not TrainConfig options")
    # the other side's defaults do not apply to it, nor other strategies' options
    strategy = cfg.strategy or defaults.get("strategy") or GLOBAL_DEFAULTS["strategy"]
    skip = set(STRATEGY.names()) - set(STRATEGY.defaults_of(strategy)) | (set(ES_ONLY) if strategy == BACKPROP
                                                                           else set())
    wrong = sorted(set(defaults) & set(TASK.names()))
    if wrong:  # a task of your own owns no built-in task's options: it reads none of them
        raise ValueError(f"task {name!r}: defaults {wrong} are options of the built-in tasks, which train() does not "
                         f"pass to a task of your own; set them in your task")
    unset = {k: v for k, v in defaults.items() if getattr(cfg, k) is None and k not in skip}
    return dataclasses.replace(cfg, task=label, **unset)


def resolve_for(cfg: TrainConfig, task=None) -> TrainConfig:
    """``cfg`` resolved for a run of ``task``: a built-in one by its name (None), or the user's own object
    (see :func:`labelled`)."""
    if task is None:
        if cfg.task.startswith(CUSTOM):
            raise ValueError(f"task {cfg.task!r} is a task of your own: pass the object (train(cfg, task=...), "
                             f"load_run(directory, task=...)); the config cannot rebuild it")
        return cfg.resolved()
    return labelled(cfg, task).resolved()


__all__ = ["BACKPROP", "CUSTOM", "STRATEGY_CHOICES", "TASK_DEFAULTS", "TrainConfig", "compiles", "custom_label",
           "is_supervised",
           "labelled", "presets", "resolve_for", "torch_env_tasks"]
