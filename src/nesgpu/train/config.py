"""Training configuration: one dataclass whose fields the CLI maps one to one; defaults per task."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..layers import KINDS
from ..strategies import STRATEGIES

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
# what a task does not set itself
GLOBAL_DEFAULTS = dict(strategy="openai_es", episodes=1, batch_size=64, lr_schedule="constant", lr_final=1.0,
                       weight_decay=0.0)
# the step size each strategy's own optimizer expects when the task's tuned lr does not apply
STRATEGY_LR = {"openai_es": 0.01, "ars": 0.02, "pgpe": 0.15}


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


@dataclass
class TrainConfig:
    """Everything a run needs. ``None`` means "the task's default" (see TASK_DEFAULTS)."""

    task: str = "digits"
    strategy: str | None = None
    layer: str = "lowrank"
    model: str | None = None
    population: int | None = None
    sigma: float | None = None
    lr: float | None = None
    steps: int | None = None
    seed: int = 0
    device: str = "auto"
    out: str | None = None  # None: a new directory runs/<task>, runs/<task>-2, ... (never an existing run)
    hidden: tuple[int, ...] | None = None
    batch_size: int | None = None
    episodes: int | None = None
    eval_episodes: int = 10
    antithetic: bool = True
    shaping: str = "centered_ranks"
    weight_decay: float | None = None
    top_b: int | None = None
    ars_version: str = "v2"
    layer_options: dict = field(default_factory=dict)
    sigma_schedule: str = "constant"
    sigma_final: float = 1.0
    lr_schedule: str | None = None
    lr_final: float | None = None
    eval_every: int = 0
    progress_every: float = 30.0  # seconds between plain progress lines when stderr is no terminal (0: none)
    target: float | None = None  # stop once the evaluated metric reaches it (gym tasks: the env's reward_threshold)
    checkpoint_every: int = 0
    chunk_size: int | str | None = None
    precision: str = "fp32"
    dist_timeout: float = 300.0

    def resolved(self) -> TrainConfig:
        """A copy with task defaults filled in, validated."""
        values = dataclasses.asdict(self)
        key = "gym" if self.task.startswith("gym:") else self.task
        defaults = TASK_DEFAULTS.get(key)
        if defaults is None:
            from ..tasks import TASK_NAMES
            raise ValueError(f"unknown task {self.task!r}; expected one of {TASK_NAMES}")
        explicit_strategy = self.strategy is not None
        from ..tasks import model_choices

        values["model"] = self.model or model_choices(key)[0]
        model_defaults = MODEL_DEFAULTS.get((key, values["model"]), {})
        for name, value in {**GLOBAL_DEFAULTS, **defaults, **model_defaults}.items():
            if values.get(name) is None:
                values[name] = value
        if explicit_strategy and self.strategy != defaults.get("strategy", "openai_es"):
            # the task's step size was tuned for its default strategy; another strategy's optimizer
            # (SGD for ARS, ClipUp for PGPE) needs its own scale
            values["lr"] = self.lr if self.lr is not None else STRATEGY_LR.get(self.strategy, values["lr"])
        values["hidden"] = tuple(values["hidden"])
        cfg = TrainConfig(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; expected one of {sorted(STRATEGIES)}")
        if self.layer not in KINDS:
            raise ValueError(f"unknown layer kind {self.layer!r}; expected one of {sorted(KINDS)}")
        from ..tasks import model_choices

        choices = model_choices("gym" if self.task.startswith("gym:") else self.task)
        if self.model not in choices:
            raise ValueError(f"unknown model {self.model!r} for task {self.task!r}; expected one of {list(choices)}")
        if self.population < 2:
            raise ValueError(f"population must be >= 2; got {self.population}")
        if self.antithetic and self.population % 2:
            raise ValueError(f"population must be even with antithetic sampling (pairs of +/- members); "
                             f"got {self.population}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0; got {self.sigma}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0; got {self.lr}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1; got {self.steps}")
        if not self.progress_every >= 0:
            raise ValueError(f"progress_every must be >= 0 seconds; got {self.progress_every}")
        if self.eval_episodes < 1:
            raise ValueError(f"eval_episodes must be >= 1; got {self.eval_episodes}")
        if KINDS[self.layer].needs_antithetic and not self.antithetic:
            raise ValueError(f"layer kind {self.layer!r} is biased without antithetic sampling (its directions of "
                             f"one step share their noise); drop --no-antithetic or choose another kind")
        if self.strategy in ("ars", "pgpe") and not self.antithetic:
            raise ValueError(f"strategy {self.strategy!r} needs antithetic sampling")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}; got {self.precision!r}")
        if self.chunk_size is not None and self.chunk_size != "auto" and not (
                isinstance(self.chunk_size, int) and 1 <= self.chunk_size <= self.directions):
            raise ValueError(f"chunk_size must be 'auto' or a number of directions in [1, {self.directions}]; "
                             f"got {self.chunk_size!r}")

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
        if values.get("hidden") is not None:
            values["hidden"] = tuple(values["hidden"])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
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
        return cls.from_dict(values, source=str(path))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)
