"""Checks of a training configuration's values: each ValueError names the option, the value and what was
expected. Every rule is stated here once (a strategy's or a kind's own rule is read from it)."""

from __future__ import annotations

import dataclasses
import math

from ...kinds import make_kind
from ...layers import KINDS
from ...layers.lowbit import check_low_bit_options
from ...options import check_type
from ...strategies import STRATEGIES
from ...tasks import TASKS as TASKS_BY_NAME
from ...tasks import supervised_tasks, task_spec
from .defaults import BACKPROP, CUSTOM, ES_ONLY, compiling_tasks, is_supervised, needs_gaussian
from .component_options import STRATEGY


def validate(cfg) -> None:
    """Check every value of a resolved config (a :class:`~nesgpu.train.setup.config.TrainConfig`)."""
    for f in dataclasses.fields(cfg):
        if f.metadata.get("component"):  # the strategy's and task's Options, checked when they were built
            continue
        check_type(f.name, getattr(cfg, f.name), f.type, "config")
        choices = f.metadata.get("choices")
        choices = choices() if callable(choices) else choices
        if choices and getattr(cfg, f.name) is not None and getattr(cfg, f.name) not in choices:
            raise ValueError(f"{f.name} must be one of {list(choices)}; got {getattr(cfg, f.name)!r}")
    custom = cfg.task.startswith(CUSTOM)
    if not custom:
        _check_model(cfg)
    _check_ranges(cfg)
    _check_es(cfg)
    _check_low_bit(cfg, custom)
    _check_backprop_task(cfg.strategy, cfg.task)
    if not custom:
        _check_task_options(cfg)
    if cfg.chunk_size is not None and cfg.chunk_size != "auto" and not (
            isinstance(cfg.chunk_size, int) and 1 <= cfg.chunk_size <= cfg.directions):
        raise ValueError(f"chunk_size must be 'auto' or a number of directions in [1, {cfg.directions}]; "
                         f"got {cfg.chunk_size!r}")


def check_hidden_applies(values: dict) -> None:
    """``hidden`` sizes given for a task whose model is a loaded checkpoint (``hf:DIR``) would be recorded and
    ignored: an error (before the task's default, no hidden layers, fills them in)."""
    if values["task"] not in TASKS_BY_NAME or not values.get("hidden"):
        return
    if task_spec(values["task"]).model_prefix is not None:
        raise ValueError(f"option 'hidden' (= {','.join(map(str, values['hidden']))}) does not apply to task "
                         f"{values['task']!r}: its model is the checkpoint --model names, as it is; drop it")


def _check_model(cfg) -> None:
    spec = task_spec(cfg.task)
    if spec.model_prefix is not None:  # a location: hf:DIR
        if not cfg.model.startswith(spec.model_prefix) or cfg.model in spec.models:
            got = "no --model was given" if cfg.model in spec.models else f"got {cfg.model!r}"
            raise ValueError(f"task {cfg.task!r} needs --model {spec.models[0]}, a local Hugging Face model "
                             f"directory; {got}")
        return
    if cfg.model not in spec.models:
        raise ValueError(f"unknown model {cfg.model!r} for task {cfg.task!r}; expected one of {list(spec.models)}")


def _check_ranges(cfg) -> None:
    for name, low in (("population", 2), ("steps", 1), ("seed", 0), ("eval_every", 0), ("checkpoint_every", 0)):
        if getattr(cfg, name) < low:
            raise ValueError(f"{name} must be >= {low}; got {getattr(cfg, name)}")
    if cfg.seed >= 2**63:
        raise ValueError(f"seed must be below 2**63; got {cfg.seed}")
    for name in ("sigma", "lr"):
        value = getattr(cfg, name)
        if value == "auto":
            continue
        if isinstance(value, str) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a positive finite number or 'auto'; got {value!r}")
    if not 0 < cfg.dist_timeout < math.inf:
        raise ValueError(f"dist_timeout must be a positive finite number; got {cfg.dist_timeout}")
    if cfg.time_budget is not None and not 0 < cfg.time_budget < math.inf:
        raise ValueError(f"time_budget must be a positive finite number of seconds; got {cfg.time_budget}")
    for name in ("sigma_final", "lr_final", "progress_every", "eval_seconds"):
        if not 0 <= getattr(cfg, name) < math.inf:
            raise ValueError(f"{name} must be a finite number >= 0; got {getattr(cfg, name)}")
    if cfg.target is not None and not math.isfinite(cfg.target):
        raise ValueError(f"target must be a finite number; got {cfg.target}")
    if max(cfg.population, cfg.steps) > 1 << 40:
        raise ValueError(f"population and steps must be below 2^40; got {cfg.population} and {cfg.steps}")
    if any(h < 1 for h in cfg.hidden):
        raise ValueError(f"hidden sizes must be >= 1; got {cfg.hidden}")


def _check_es(cfg) -> None:
    """The population, the kind and the strategy's own rules."""
    if cfg.antithetic and cfg.population % 2:
        raise ValueError(f"population must be even with antithetic sampling (pairs of +/- members); "
                         f"got {cfg.population}")
    options = cfg.strategy_options
    strategy = STRATEGIES.get(cfg.strategy)
    if strategy is not None:
        strategy.check_options(options, cfg.directions)
    check_layer_options(cfg.layer, cfg.layer_options)
    if KINDS[cfg.layer].needs_antithetic and not cfg.antithetic:
        raise ValueError(f"layer kind {cfg.layer!r} is biased without antithetic sampling (its directions of "
                         f"one step share their noise); drop --no-antithetic or choose another kind")
    if strategy is not None and strategy.needs_antithetic and not cfg.antithetic:
        raise ValueError(f"strategy {cfg.strategy!r} needs antithetic sampling")
    if isinstance(cfg.anchor, bool) or not isinstance(cfg.anchor, (int, float)) or not 0 <= cfg.anchor < 1:
        raise ValueError(f"anchor must be a number in [0, 1) (the share of the way back to the starting weights "
                         f"each step); got {cfg.anchor!r}")
    if cfg.update != "strategy" and strategy is not None:
        check_in_place(cfg.strategy, strategy, options)
    if cfg.update != "strategy" and cfg.anchor and cfg.dtype in ("bfloat16", "float16"):
        raise ValueError(f"--anchor pulls the weights a share of the way back each step, which {cfg.dtype} weights "
                         f"updated in place round away (a drift under 1 / (2 anchor) of their resolution stays); use "
                         f"--update strategy (float32 masters) or float32 weights")
    if strategy is not None and strategy.adapts_sigma and cfg.sigma_schedule != "constant":
        raise ValueError(f"strategy {cfg.strategy!r} adapts sigma itself; a sigma_schedule does not apply to it")
    if needs_gaussian(strategy, cfg.layer, options):
        what = "a covariance" if strategy.adapts_covariance else "a sigma per parameter"
        raise ValueError(f"strategy {cfg.strategy!r} adapts {what}, which layer {cfg.layer!r} cannot carry (its "
                         f"noise is shared or structured); use --layer gaussian")


def check_in_place(name: str, strategy, options) -> None:
    """``--update sgd`` or ``adam`` writes the plain ES estimate into the weights: not for a strategy that adapts a
    sigma per parameter or a covariance from the same pass."""
    if strategy.adapts_scales or strategy.adapts_covariance:
        raise ValueError(f"--update sgd and adam write the plain ES estimate into the weights; strategy {name!r} "
                         f"adapts its noise from the update's pass: use --update strategy")


def bits_apply(task: str, model: str) -> bool:
    """Whether ``bits`` applies to a built-in task's model: the supervised tasks' mlp and cnn."""
    return is_supervised(task) and model in ("mlp", "cnn")


def act_bits_apply(model: str) -> bool:
    """Whether ``act_bits`` applies to a built-in model: mlp's Linear layers."""
    return model == "mlp"


def _check_low_bit(cfg, custom: bool) -> None:
    """The low-bit options: the one place their rules are stated."""
    check_low_bit_options(cfg.bits, cfg.noise_on, cfg.act_bits, hint="add --bits 1 or --bits 8")
    if custom:  # the user's model: convert() refuses what it cannot quantise
        return
    if cfg.act_bits is not None and not act_bits_apply(cfg.model):
        raise ValueError(f"act_bits={cfg.act_bits} applies to the Linear layers of model mlp; got model "
                         f"{cfg.model!r}")
    if cfg.bits is not None and not bits_apply(cfg.task, cfg.model):
        raise ValueError(f"bits={cfg.bits} applies to the supervised tasks' models mlp and cnn (Linear and "
                         f"Conv1d layers); got task {cfg.task!r} with model {cfg.model!r}")


def _check_task_options(cfg) -> None:
    """Compile where the task has no compiled path (the task's options checked themselves when built)."""
    if cfg.compile == "on" and cfg.task not in compiling_tasks():
        raise ValueError(f"compile='on' applies to the built-in torch environments and generation tasks "
                         f"{compiling_tasks()}; task {cfg.task!r} runs eagerly (use --compile auto or off)")


def _check_backprop_task(strategy: str, task: str) -> None:
    if strategy == BACKPROP and not task.startswith(CUSTOM) and not is_supervised(task):
        raise ValueError(f"strategy 'backprop' trains supervised tasks {supervised_tasks()}; task "
                         f"{task!r} has no differentiable loss (use an ES strategy)")


def check_strategy_options(values: dict, given: dict, strategy: str, defaults: dict, preset: dict,
                           tuned: dict) -> None:
    """The ES-only options set under backprop (``values``: the run's options) are errors, and another strategy's
    options given (``top_b`` under openai_es) are errors or, at their defaults, dropped from ``given``
    (:meth:`~nesgpu.options.Owners.drop_foreign`; ``tuned``: the task's values of them). ``defaults`` are the
    fields' defaults, ``preset`` the run's :func:`presets`."""
    _check_backprop_task(strategy, values["task"])  # before its options are found not to be the task's
    if strategy == BACKPROP:
        for name in ES_ONLY:
            value = values.get(name)
            value = tuple(value) if isinstance(value, list) else value
            if value is not None and value not in (defaults[name], preset.get(name, defaults[name])):
                raise ValueError(f"option {name!r} (= {values[name]!r}) applies to the ES strategies, not to "
                                 f"strategy 'backprop'; drop it or choose an ES strategy")
    STRATEGY.drop_foreign(given, strategy, tuned)


def check_layer_options(layer: str, options: dict) -> None:
    """The options must be the layer kind's own, with valid values."""
    names = [f.name for f in dataclasses.fields(KINDS[layer])]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise ValueError(f"layer option(s) {unknown} do not apply to layer {layer!r}; its options: {names or 'none'}")
    make_kind(layer, **options)  # the kind checks its values
