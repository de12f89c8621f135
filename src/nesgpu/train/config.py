"""Training configuration: one dataclass whose fields the CLI maps one to one; defaults per task."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..layers import KINDS
from ..layers.lowbit import NOISE_ON
from ..quantize import BITS
from ..strategies import STRATEGIES
from ..strategies.schedules import KINDS as SCHEDULES
from .ars_paper import PRESETS, preset_values
from .initialization import INITS

# Per-task defaults, tuned on a 2-core CPU from starting points in the ES literature (Salimans et al. 2017,
# Mania et al. 2018, Toklu et al. 2020). Strategy: OpenAI-ES + Adam unless a task says otherwise (CartPole:
# PGPE + ClipUp, which solves it in a few steps). population = members per step (both signs counted),
# sigma, lr (for the task's strategy), steps, hidden sizes of the MLP (() = a linear policy; the transformer
# of "reverse" and "sort": (d_model, n_layers)), batch_size = samples per member per step (supervised),
# episodes = start states per member per step (RL). The sequence tasks' defaults reach >= 95% test token
# accuracy well within 10 minutes on 2 CPU cores (benchmarks/results/transformer_es_vs_adamw_*.json).
TASK_DEFAULTS: dict[str, dict] = {
    "digits": dict(population=512, sigma=0.1, lr=0.005, steps=1000, hidden=(64,), batch_size=128,
                   weight_decay=0.005),
    "mnist1d": dict(population=512, sigma=0.05, lr=0.005, steps=1500, hidden=(128,), batch_size=64),
    "reverse": dict(population=256, sigma=0.05, lr=0.01, steps=300, hidden=(32, 2), batch_size=32),
    "sort": dict(population=512, sigma=0.05, lr=0.01, steps=1000, hidden=(32, 2), batch_size=32,
                 lr_schedule="cosine", lr_final=0.1),
    "cartpole": dict(strategy="pgpe", population=64, sigma=0.5, lr=0.15, steps=20, hidden=()),
    "pendulum": dict(population=256, sigma=0.5, lr=0.1, steps=300, hidden=(64,), episodes=2),
    "acrobot": dict(population=64, sigma=0.1, lr=0.05, steps=50, hidden=(16,)),
    "mountaincar": dict(population=64, sigma=0.5, lr=0.05, steps=40, hidden=(16,)),
    "gym": dict(population=64, sigma=0.05, lr=0.02, steps=200, hidden=(32,)),
}
# what a non-default model of a task changes (over TASK_DEFAULTS); hidden = the Conv1d channels of "cnn"
MODEL_DEFAULTS: dict[tuple[str, str], dict] = {
    ("mnist1d", "cnn"): dict(hidden=(32, 32, 32), lr=0.01, steps=1200),
}
PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
# the gradient baseline: not an ES strategy (no population, no noise) but a strategy name of the config, so a
# run differs from an ES run by one option; its defaults are AdamW's own
BACKPROP = "backprop"
BACKPROP_DEFAULTS = dict(lr=1e-3, weight_decay=0.01)
STRATEGY_CHOICES = (*sorted(STRATEGIES), BACKPROP)
# the options of ES runs only, and of backprop runs only (each an error, when set, under the other)
ES_ONLY = ("population", "sigma", "layer", "layer_options", "bits", "noise_on", "act_bits", "antithetic", "shaping",
           "sigma_schedule", "sigma_final", "chunk_size", "compile")
BACKPROP_ONLY = ("optimizer", "accumulate", "activation_checkpointing", "shard")
# what neither the task nor its model sets
GLOBAL_DEFAULTS = dict(strategy="openai_es", episodes=1, batch_size=64, lr_schedule="constant", lr_final=1.0,
                       weight_decay=0.0)


def presets(task: str, model: str | None = None, strategy: str | None = None) -> dict:
    """The defaults a run of ``task`` (with ``model`` and ``strategy``, None: the task's own) starts from:
    global defaults < the task's < its model's. The task's tuned step size holds for its own strategy;
    another strategy starts from that strategy's ``default_lr`` (its optimizer has another scale)."""
    key = "gym" if task.startswith("gym:") else task
    if key not in TASK_DEFAULTS:
        from ..tasks import TASK_NAMES
        raise ValueError(f"unknown task {task!r}; expected one of {TASK_NAMES}")
    from ..tasks import model_choices

    choices = model_choices(key)
    model = model or choices[0]
    values = {**GLOBAL_DEFAULTS, **TASK_DEFAULTS[key], **MODEL_DEFAULTS.get((key, model), {}), "model": model}
    if strategy is not None and strategy != values["strategy"]:
        if strategy == BACKPROP:
            values.update(strategy=strategy, **BACKPROP_DEFAULTS)
        elif strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; expected one of {list(STRATEGY_CHOICES)}")
        else:
            values.update(strategy=strategy, lr=STRATEGIES[strategy].default_lr)
    values["observation_clip"] = 0.0 if values["strategy"] == "ars" else 5.0  # the ARS paper does not clip
    return values


def _torch_env_tasks() -> list[str]:
    from ..tasks import ENVS

    return sorted(ENVS)


# the built-in RL runs compile their rollouts when they make at least this many environment steps: compiling
# takes ~3 s (cached) to ~12 s (cold) on a 2-core CPU, and the compiled loop is ~2.8x faster (BENCHMARKS.md)
COMPILE_MIN_ENV_STEPS = 20_000_000


def compiles(cfg: TrainConfig) -> bool:
    """Whether a resolved config's rollouts run compiled (``compile``: on, off, or auto by the run's size)."""
    if cfg.compile != "auto":
        return cfg.compile == "on"
    if cfg.task not in _torch_env_tasks():
        return False
    from ..tasks import ENVS

    return cfg.steps * cfg.population * cfg.episodes * ENVS[cfg.task].max_steps >= COMPILE_MIN_ENV_STEPS


def _check_strategy_options(values: dict, strategy: str) -> None:
    """An option of another strategy (``top_b`` under openai_es) set away from its default is an error, not
    silently ignored."""
    defaults = field_defaults()
    preset = presets(values["task"], values.get("model"), values.get("strategy"))
    if strategy == BACKPROP or any(values.get(name) != defaults[name] for name in BACKPROP_ONLY):
        _check_backprop_options(values, strategy, defaults, preset)
    own = {"weight_decay": "weight_decay"} if strategy == BACKPROP else STRATEGIES[strategy].config_options
    for other, cls in STRATEGIES.items():
        for name in cls.config_options:
            if name not in own and values.get(name) not in (defaults[name], preset.get(name, defaults[name]),
                                                            GLOBAL_DEFAULTS.get(name, defaults[name])):
                raise ValueError(f"option {name!r} (= {values[name]!r}) applies to strategy {other!r}, not "
                                 f"{strategy!r}; drop it or choose --strategy {other}")


def field_defaults() -> dict:
    """Every TrainConfig field's default (a fresh one for fields with a default factory)."""
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(TrainConfig)}


def _check_backprop_options(values: dict, strategy: str, defaults: dict, preset: dict) -> None:
    """ES options set under backprop, or backprop options set under an ES strategy, are errors."""
    def is_set(name):
        value = values.get(name)
        if isinstance(value, (list, tuple)):
            value = tuple(value)
        return value is not None and value not in (defaults[name], preset.get(name, defaults[name]))

    if strategy == BACKPROP:
        for name in ES_ONLY:
            if is_set(name):
                raise ValueError(f"option {name!r} (= {values[name]!r}) applies to the ES strategies, not to "
                                 f"strategy 'backprop'; drop it or choose an ES strategy")
        return
    for name in BACKPROP_ONLY:
        if is_set(name):
            raise ValueError(f"option {name!r} (= {values[name]!r}) applies to strategy 'backprop', not {strategy!r}; "
                             f"drop it or choose --strategy backprop")


def _check_layer_options(layer: str, options: dict) -> None:
    """The options must be the layer kind's own, with valid values."""
    from ..kinds import make_kind

    names = [f.name for f in dataclasses.fields(KINDS[layer])]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise ValueError(f"layer option(s) {unknown} do not apply to layer {layer!r}; its options: {names or 'none'}")
    make_kind(layer, **options)  # the kind checks its values


def _check_type(name: str, value, annotation: str, source: str) -> None:
    """``value`` fits the field's annotation (a string: this module uses postponed annotations). YAML and
    JSON give bools, ints, floats, strings, lists and mappings; "no" is a string, not False, and 3.7 is
    not an int."""
    allowed = [a.strip() for a in annotation.split("|")]
    if value is None and "None" in allowed:
        return
    checks = {
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "dict": lambda v: isinstance(v, dict),
        "tuple[int, ...]": lambda v: isinstance(v, (list, tuple)) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v),
    }
    if not any(checks[a](value) for a in allowed if a in checks):
        raise ValueError(f"{source}: option {name!r} must be {' or '.join(allowed)}; got {value!r} "
                         f"({type(value).__name__})")


def opt(default=None, help: str = "", **cli):
    """A TrainConfig field: its default, a one-line doc, and what the CLI needs beyond its type (``choices``,
    ``metavar``, ``flag`` for another flag name, ``parse`` for a custom parser, ``per_task`` when None means
    the task's default)."""
    factory = {"default_factory": default} if callable(default) else {"default": default}
    return field(**factory, metadata={"help": help, **cli})


@dataclass
class TrainConfig:
    """Everything a run needs: the one source of the training options. ``nesgpu train``'s flags are
    generated from these fields (``--batch-size`` for ``batch_size``), and YAML/JSON configs use the same
    names. ``None`` means "the task's default" (see :func:`presets` and TASK_DEFAULTS)."""

    task: str = opt("digits", "digits | mnist1d | reverse | sort | cartpole | pendulum | acrobot | mountaincar | "
                    "gym:<id>")
    strategy: str | None = opt(help="the ES algorithm, or backprop: the gradient baseline (supervised tasks)",
                               choices=STRATEGY_CHOICES, per_task=True)
    layer: str = opt("lowrank", "perturbation kind of the model's matrices", choices=tuple(sorted(KINDS)))
    model: str | None = opt(help="architecture: mlp; mnist1d also cnn (Conv1d); reverse, sort: transformer",
                            per_task=True)
    population: int | None = opt(help="members per step, both signs counted", per_task=True)
    sigma: float | None = opt(help="noise scale", per_task=True)
    lr: float | None = opt(help="step size (another strategy than the task's: that strategy's own default)",
                           per_task=True)
    steps: int | None = opt(help="ES steps", per_task=True)
    seed: int = opt(0, "seed of the initial weights, the noise and the data")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    out: str | None = opt(help="run directory (default: a new runs/<task>, runs/<task>-2, ...)")
    hidden: tuple[int, ...] | None = opt(help="hidden sizes, e.g. 64,64; 0 for a linear model; cnn: channels per "
                                         "Conv1d; transformer: d_model[,n_layers[,n_heads[,dim_feedforward]]]",
                                         per_task=True, metavar="N,N")
    batch_size: int | None = opt(help="supervised: samples per member per step", per_task=True)
    episodes: int | None = opt(help="RL: episodes (start states) per member per step", per_task=True)
    eval_episodes: int = opt(10, "RL: episodes of each evaluation of the plain policy")
    vector_mode: str = opt("sync", "gym:<id> tasks: step the envs in this process (sync) or in one subprocess "
                           "each (async)", choices=("sync", "async"))
    antithetic: bool = opt(True, "mirrored sampling: each direction evaluated at +sigma and -sigma")
    shaping: str = opt("centered_ranks", "openai_es, pgpe: fitness shaping",
                       choices=("centered_ranks", "z_score", "raw"))
    weight_decay: float | None = opt(help="openai_es: L2 coefficient added to the gradient", per_task=True)
    top_b: int | None = opt(help="ars: directions used per step (default: all)")
    ars_version: str = opt("v2", "ars: v1 (raw observations) or v2 (running observation statistics)",
                           choices=("v1", "v2"))
    layer_options: dict = opt(dict, "options of the layer kind (each also a flag of its own, e.g. --rank)")
    bits: int | None = opt(help="low-bit weights in every Linear and Conv layer: 1 (binary) or 8 (int8), each with a "
                           "per-output-channel scale, quantised from the float weights ES updates (default: float; "
                           "models mlp and cnn)", choices=BITS)
    noise_on: str = opt("latent", "with --bits: perturb the float weights, then quantise each member (latent), or add "
                        "the noise to the shared quantised weights (quantized)", choices=NOISE_ON)
    act_bits: int | None = opt(help="with --bits: 8 quantises every Linear's input rows to int8 and runs the shared "
                               "low-bit product as an int8 GEMM (model mlp; default: float inputs)", choices=(8,))
    sigma_schedule: str = opt("constant", "sigma over the steps", choices=SCHEDULES)
    sigma_final: float = opt(1.0, "sigma factor at the last step")
    lr_schedule: str | None = opt(help="lr over the steps", choices=SCHEDULES, per_task=True)
    lr_final: float | None = opt(help="lr factor at the last step", per_task=True)
    eval_every: int = opt(0, "steps between evaluations (0: a tenth of the run)")
    eval_seconds: float = opt(0.0, "also evaluate once this many seconds have passed since the last evaluation "
                              "(0: by steps only)")
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
    reward_shift: float = opt(0.0, "RL: subtracted from every training step's reward (ARS's survival-bonus shift: "
                              "1 for Hopper, Walker2d, Ant); evaluations are unshifted")
    start_states: str = opt("shared", "RL: shared (every direction and sign starts from the step's episodes' "
                            "states: common random numbers) or independent (a start state per rollout, as ARS)",
                            choices=("shared", "independent"))
    policy_output: str = opt("auto", "RL, continuous actions: tanh (bounded) or linear (the raw output, as ARS's "
                             "linear policy); auto: linear for ars with --hidden 0, else tanh",
                             choices=("auto", "tanh", "linear"))
    observation_clip: float | None = opt(help="RL: clip standardised observations to +-this; 0: none (default: "
                                         "5; ars: none, as the paper)", per_task=True)
    preset: str | None = opt(help="a published setting: ars-paper (ARS V2-t's alpha, N, b, nu, shift and "
                             "threshold for gym:HalfCheetah/Hopper/Walker2d/Ant/Humanoid-v5); it expands into the "
                             "options it sets, except those given explicitly", choices=PRESETS)
    compile: str = opt("auto", "built-in RL envs: compile each env step with the population forward (torch.compile; "
                       "auto: on when the run makes >= 20M env steps, where the seconds of compiling pay)",
                       choices=("auto", "on", "off"))
    init: str = opt("default", "initial weights of Linear and Conv layers: torch's default, he (Kaiming normal) or "
                    "xavier (Glorot uniform); biases zero", choices=INITS)
    optimizer: str = opt("adamw", "backprop: a torch.optim optimizer by name (adamw, adam, sgd, ...)")
    accumulate: int = opt(1, "backprop: micro-batches of batch_size per step, their gradients accumulated")
    activation_checkpointing: bool = opt(False, "backprop: recompute each block's activations in the backward "
                                         "pass instead of storing them (torch.utils.checkpoint)")
    shard: bool = opt(False, "backprop under torchrun: shard parameters, gradients and optimizer state over the "
                      "processes (FSDP2 fully_shard, ZeRO-3) instead of replicating them (DDP)")
    dist_timeout: float = opt(300.0, "torchrun: seconds before a collective with a dead or hung process fails")

    def resolved(self) -> TrainConfig:
        """A copy with the task's presets filled in, validated. A ``preset`` first sets the options that
        are still at their defaults (an option given explicitly keeps its value)."""
        values = dataclasses.asdict(self)
        if self.preset is not None:  # built in Python: the fields still at their defaults take the preset's
            defaults = field_defaults()
            for name, value in preset_values(self.preset, self.task).items():
                if values[name] == defaults[name]:
                    values[name] = value
            values["preset"] = None  # expanded: the options it set are the run's own from here on
        defaults = presets(values["task"], values["model"], values["strategy"])
        _check_strategy_options(values, defaults["strategy"])
        for name, value in defaults.items():
            if values.get(name) is None:
                values[name] = value
        values["hidden"] = tuple(values["hidden"])
        from ..tasks import SUPERVISED

        if values["policy_output"] == "auto" and values["task"] not in SUPERVISED:  # ARS's linear policy: linear
            values["policy_output"] = "linear" if values["strategy"] == "ars" and not values["hidden"] else "tanh"
        cfg = TrainConfig(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check every value of a resolved config; a ValueError names the option, the value and what was
        expected."""
        types = {f.name: f.type for f in dataclasses.fields(self)}
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), types[f.name], "config")
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) is not None and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {list(choices)}; got {getattr(self, f.name)!r}")
        from ..tasks import model_choices

        choices = model_choices("gym" if self.task.startswith("gym:") else self.task)
        if self.model not in choices:
            raise ValueError(f"unknown model {self.model!r} for task {self.task!r}; expected one of {list(choices)}")
        for name, low in (("population", 2), ("accumulate", 1), ("steps", 1), ("batch_size", 1), ("episodes", 1),
                          ("eval_episodes", 1),
                          ("seed", 0), ("eval_every", 0), ("checkpoint_every", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}; got {getattr(self, name)}")
        for name in ("sigma", "lr", "dist_timeout"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a positive finite number; got {getattr(self, name)}")
        if self.time_budget is not None and not 0 < self.time_budget < math.inf:
            raise ValueError(f"time_budget must be a positive finite number of seconds; got {self.time_budget}")
        for name in ("sigma_final", "lr_final", "weight_decay", "progress_every", "eval_seconds"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number >= 0; got {getattr(self, name)}")
        if self.target is not None and not math.isfinite(self.target):
            raise ValueError(f"target must be a finite number; got {self.target}")
        if max(self.population, self.steps, self.batch_size, self.episodes, self.eval_episodes) > 1 << 40:
            raise ValueError(f"population, steps, batch_size and episodes must be below 2^40; got {self.population}, "
                             f"{self.steps}, {self.batch_size}, {self.episodes}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden sizes must be >= 1; got {self.hidden}")
        if self.antithetic and self.population % 2:
            raise ValueError(f"population must be even with antithetic sampling (pairs of +/- members); "
                             f"got {self.population}")
        if self.top_b is not None and not 1 <= self.top_b <= self.directions:
            raise ValueError(f"top_b must be in [1, {self.directions}] (the directions); got {self.top_b}")
        _check_layer_options(self.layer, self.layer_options)
        if KINDS[self.layer].needs_antithetic and not self.antithetic:
            raise ValueError(f"layer kind {self.layer!r} is biased without antithetic sampling (its directions of "
                             f"one step share their noise); drop --no-antithetic or choose another kind")
        if self.strategy in ("ars", "pgpe") and not self.antithetic:
            raise ValueError(f"strategy {self.strategy!r} needs antithetic sampling")
        if self.strategy == "pgpe" and self.sigma_schedule != "constant":
            raise ValueError("strategy 'pgpe' adapts sigma itself; a sigma_schedule does not apply to it")
        if self.bits is None and (self.noise_on != "latent" or self.act_bits is not None):
            option = "act_bits" if self.act_bits is not None else "noise_on"
            raise ValueError(f"{option}={getattr(self, option)!r} applies to low-bit layers; add --bits 1 or --bits 8")
        if self.act_bits is not None and self.model != "mlp":
            raise ValueError(f"act_bits={self.act_bits} applies to the Linear layers of model mlp; got model "
                             f"{self.model!r}")
        if self.bits is not None:
            from ..tasks import SUPERVISED

            if self.task not in SUPERVISED or self.model not in ("mlp", "cnn"):
                raise ValueError(f"bits={self.bits} applies to the supervised tasks' models mlp and cnn (Linear and "
                                 f"Conv1d layers); got task {self.task!r} with model {self.model!r}")
        if self.strategy == BACKPROP:
            self._validate_backprop()
        if not math.isfinite(self.reward_shift) or not 0 <= self.observation_clip < math.inf:
            raise ValueError(f"reward_shift must be finite and observation_clip a finite number >= 0 (0: none); "
                             f"got {self.reward_shift} and {self.observation_clip}")
        from ..tasks import SUPERVISED

        rl_only = {"reward_shift": (0.0,), "start_states": ("shared",), "policy_output": ("auto", "tanh")}
        if self.task in SUPERVISED:
            for name, allowed in rl_only.items():
                if getattr(self, name) not in allowed:
                    raise ValueError(f"option {name!r} (= {getattr(self, name)!r}) applies to RL tasks; task "
                                     f"{self.task!r} is supervised")
        if self.compile == "on" and self.task not in _torch_env_tasks():
            raise ValueError(f"compile='on' applies to the built-in torch environments {_torch_env_tasks()}; task "
                             f"{self.task!r} runs eagerly (use --compile auto or off)")
        if self.chunk_size is not None and self.chunk_size != "auto" and not (
                isinstance(self.chunk_size, int) and 1 <= self.chunk_size <= self.directions):
            raise ValueError(f"chunk_size must be 'auto' or a number of directions in [1, {self.directions}]; "
                             f"got {self.chunk_size!r}")

    def _validate_backprop(self) -> None:
        from ..tasks import SUPERVISED

        if self.task not in SUPERVISED:
            raise ValueError(f"strategy 'backprop' trains supervised tasks {sorted(SUPERVISED)}; task {self.task!r} "
                             f"has no differentiable loss (use an ES strategy)")
        from .backprop import optimizer_class

        optimizer_class(self.optimizer)  # names the optimizers when unknown

    @property
    def directions(self) -> int:
        return self.population // 2 if self.antithetic else self.population

    # ----- files -------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict, source: str = "config") -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"{source}: unknown option(s) {unknown}; expected a subset of {sorted(names)}")
        values = dict(values)
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for name, value in values.items():
            _check_type(name, value, types[name], source)
        if values.get("preset") is not None:  # the options given here keep their values, even a default's
            for name, value in preset_values(values["preset"], values.get("task", "digits")).items():
                values.setdefault(name, value)
            values["preset"] = None
        if values.get("hidden") is not None:
            values["hidden"] = tuple(values["hidden"])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """A config from a YAML (or JSON) file of options; unknown or mistyped options name the field."""
        return cls.from_dict(cls.read_yaml(path), source=str(path))

    @classmethod
    def read_yaml(cls, path: str | Path) -> dict:
        """The options a YAML (or JSON) file sets, checked against the fields (as from_dict does)."""
        import yaml

        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"cannot read the config file {path}: {e.strerror}") from e
        try:
            values = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path} is not valid YAML: {str(e).splitlines()[0]}"
                             + (f" (line {e.problem_mark.line + 1})" if getattr(e, "problem_mark", None) else "")) from e
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
