"""Training configuration: one dataclass whose fields the CLI maps one to one; defaults per task."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..layers import KINDS
from ..strategies import STRATEGIES

# Per-task defaults, from what the ES literature uses for these problems (Salimans et al. 2017 for
# OpenAI-ES on small control tasks, Mania et al. 2018 for ARS, Toklu et al. 2020 for PGPE / ClipUp):
# population = members per step (both signs counted), sigma, Adam lr, steps, hidden sizes of the MLP.
TASK_DEFAULTS: dict[str, dict] = {
    "digits": dict(population=512, sigma=0.05, lr=0.03, steps=500, hidden=(64,), batch_size=32),
    "mnist1d": dict(population=512, sigma=0.05, lr=0.02, steps=1500, hidden=(128,), batch_size=64),
    "cartpole": dict(population=64, sigma=0.1, lr=0.05, steps=40, hidden=(16,)),
    "pendulum": dict(population=128, sigma=0.1, lr=0.03, steps=300, hidden=(32,)),
    "acrobot": dict(population=64, sigma=0.1, lr=0.05, steps=50, hidden=(16,)),
    "mountaincar": dict(population=64, sigma=0.5, lr=0.05, steps=100, hidden=(16,)),
    "gym": dict(population=64, sigma=0.05, lr=0.02, steps=200, hidden=(32,)),
}
# the step size each strategy's own optimizer expects when the task's Adam lr does not apply
STRATEGY_LR = {"ars": 0.02, "pgpe": 0.15}


@dataclass
class TrainConfig:
    """Everything a run needs. ``None`` means "the task's default" (see TASK_DEFAULTS)."""

    task: str = "digits"
    strategy: str = "openai_es"
    layer: str = "lowrank"
    population: int | None = None
    sigma: float | None = None
    lr: float | None = None
    steps: int | None = None
    seed: int = 0
    device: str = "auto"
    out: str = "runs/default"
    hidden: tuple[int, ...] | None = None
    batch_size: int | None = None
    episodes: int = 1
    eval_episodes: int = 10
    antithetic: bool = True
    shaping: str = "centered_ranks"
    weight_decay: float = 0.0
    top_b: int | None = None
    ars_version: str = "v2"
    layer_options: dict = field(default_factory=dict)
    sigma_schedule: str = "constant"
    sigma_final: float = 1.0
    lr_schedule: str = "constant"
    lr_final: float = 1.0
    eval_every: int = 0
    checkpoint_every: int = 0

    def resolved(self) -> TrainConfig:
        """A copy with task defaults filled in, validated."""
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; expected one of {sorted(STRATEGIES)}")
        if self.layer not in KINDS:
            raise ValueError(f"unknown layer kind {self.layer!r}; expected one of {sorted(KINDS)}")
        key = "gym" if self.task.startswith("gym:") else self.task
        defaults = TASK_DEFAULTS.get(key)
        if defaults is None:
            from ..tasks import TASK_NAMES
            raise ValueError(f"unknown task {self.task!r}; expected one of {TASK_NAMES}")
        values = dataclasses.asdict(self)
        for name, value in defaults.items():
            if values.get(name) is None:
                values[name] = value
        if self.lr is None and self.strategy in STRATEGY_LR:
            values["lr"] = STRATEGY_LR[self.strategy]
        if values["batch_size"] is None:
            values["batch_size"] = 64
        values["hidden"] = tuple(values["hidden"])
        cfg = TrainConfig(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
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
        if self.strategy in ("ars", "pgpe") and not self.antithetic:
            raise ValueError(f"strategy {self.strategy!r} needs antithetic sampling")

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
        if values.get("hidden") is not None:
            values["hidden"] = tuple(values["hidden"])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        import yaml

        text = Path(path).read_text()
        values = yaml.safe_load(text) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of options; got {type(values).__name__}")
        return cls.from_dict(values, source=str(path))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)
