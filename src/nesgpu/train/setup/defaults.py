"""Where a run's unset options come from: global defaults < the task's own (declared by each task module in
the registry, ``nesgpu.tasks.TASKS``) < its model's; a strategy other than the task's starts from its own
step size. Nothing here is per task: adding a task touches nothing in train/."""

from __future__ import annotations

import dataclasses

from ...layers import KINDS
from ...strategies import STRATEGIES
from ...tasks import TASKS, DifferentiableTask, task_spec
from .component_options import BACKPROP, STRATEGY, TASK, joined, split, task_key

# the gradient baseline is a strategy name of the config, so a run differs from an ES run by one option; its
# step size is AdamW's own (its other options are BackpropOptions')
BACKPROP_DEFAULTS = dict(lr=1e-3)
# the options of ES runs only (each an error, when set, under backprop); each strategy's own options are its
# Options' (nesgpu.train.setup.component_options)
ES_ONLY = ("population", "sigma", "layer", "layer_options", "bits", "noise_on", "act_bits", "antithetic", "anchor",
           "evolve", "sigma_schedule", "sigma_final", "chunk_size", "compile", "dtype", "update")
# what neither the task nor its model sets
GLOBAL_DEFAULTS = dict(strategy="openai_es", layer="lowrank", lr_schedule="constant", lr_final=1.0, antithetic=True,
                       update="strategy")
# a task of the user's own (``train(cfg, task=...)``) is labelled "custom:<name>"; it starts from these where
# neither the config nor the task's own ``defaults`` mapping sets an option
CUSTOM = "custom:"
# (sigma and lr: from the model's own response, nesgpu.probe, and the strategy's rule)
CUSTOM_DEFAULTS = dict(population=64, sigma="auto", lr="auto", steps=100, hidden=(32,), model="default")
# each built-in task's tuned options, as the registry declares them (a read-only view)
TASK_DEFAULTS: dict[str, dict] = {name: dict(spec.defaults) for name, spec in TASKS.items()}
# the built-in RL runs compile their rollouts when they make at least this many environment steps: compiling
# takes ~3 s (cached) to ~12 s (cold) on a 2-core CPU, and the compiled loop is ~2.8x faster (BENCHMARKS.md)
COMPILE_MIN_ENV_STEPS = 20_000_000
# ... and, under a time budget, only when it is at least this many seconds: compiling took 77 s of a 40 s budget
# on a busy 2-core CPU (issue 55), and pays off only once the faster steps win that time back
COMPILE_MIN_BUDGET = 300.0


def chosen_strategy(task: str, strategy: str | None) -> str | None:
    """The strategy a run of ``task`` uses: ``strategy``, else the task's own (None: an unknown task)."""
    if strategy is not None:
        return strategy
    if task.startswith(CUSTOM):
        return GLOBAL_DEFAULTS["strategy"]
    try:
        return task_spec(task).defaults.get("strategy", GLOBAL_DEFAULTS["strategy"])
    except ValueError:
        return None


def preset_parts(task: str, model: str | None = None, strategy: str | None = None) -> tuple[dict, dict, dict]:
    """The defaults a run of ``task`` (with ``model`` and ``strategy``, None: the task's own) starts from, as
    the run's options, the strategy's and the task's: global defaults < the task's < its model's. The task's
    tuned step size, update and strategy options hold for its own strategy; another strategy starts from its own
    optimizer (``update="strategy"``), ``default_lr`` and options. A custom task starts from
    ``CUSTOM_DEFAULTS`` (its own defaults are set in the config first: ``labelled``)."""
    if task.startswith(CUSTOM):
        run, tuned, options = {**GLOBAL_DEFAULTS, **CUSTOM_DEFAULTS}, {}, {}
        run["model"] = model or run["model"]
    else:
        spec = task_spec(task)
        model = model or spec.models[0]
        given = {**spec.defaults, **spec.model_defaults.get(model, {})}
        run, tuned, options = split(given, chosen_strategy(task, None), task, f"task {task!r}'s defaults")
        run = {**GLOBAL_DEFAULTS, **run, "model": model}
        options = {**TASK.defaults_of(task_key(task)), **options}
    own = run["strategy"]  # the strategy the task's values were tuned for
    if strategy is not None and strategy != own:
        if strategy == BACKPROP:
            run.update(strategy=strategy, **BACKPROP_DEFAULTS)
        elif strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; expected one of {strategy_choices()}")
        else:
            # a sigma from the probe takes the strategy's own rule for lr (auto); else its own default
            lr = "auto" if run.get("lr") == "auto" else STRATEGIES[strategy].default_lr
            run.update(strategy=strategy, lr=lr, update="strategy")  # its own optimizer, as its own lr
    chosen = STRATEGIES.get(run["strategy"])
    if not getattr(chosen, "default_antithetic", True):  # CMA-ES: independent members
        run["antithetic"] = False
    if needs_gaussian(chosen, run["layer"]):  # the layer follows the strategy
        run["layer"] = "gaussian"
    # the strategy's options: its own defaults, less what the task tuned for it (for its own strategy only)
    mine = STRATEGY.defaults_of(run["strategy"])
    mine.update({k: v for k, v in tuned.items() if run["strategy"] == own and k in mine})
    run_defaults = None if task.startswith(CUSTOM) else getattr(task_spec(task).options, "run_defaults", None)
    if run_defaults is not None:  # the task's defaults that depend on the strategy (RL: its observation clip)
        options.update(run_defaults(None if run["strategy"] == BACKPROP else run["strategy"]))
    return run, mine, options


def presets(task: str, model: str | None = None, strategy: str | None = None) -> dict:
    """:func:`preset_parts` as one config mapping (:func:`~nesgpu.train.setup.component_options.joined`)."""
    return joined(*preset_parts(task, model, strategy))


def needs_gaussian(strategy, layer: str, options=None) -> bool:
    """Whether ``strategy`` (a class or an instance; None: backprop) adapts a covariance or a sigma per parameter
    with ``options`` (default: its own), which ``layer`` cannot carry (SNES's outer-product scales ride on low-rank
    noise)."""
    options = strategy.Options() if strategy is not None and options is None else options
    if strategy is None or not (strategy.adapts_covariance or strategy.scales_with(options)):
        return False
    return layer != "gaussian" and not (strategy.outer_scales and KINDS[layer].outer_scale)


def kind_choices() -> list[str]:
    """The noise kinds a config takes: every registered one (read at each call: a kind registered later counts)."""
    return sorted(KINDS)


def strategy_choices() -> list[str]:
    """The strategy names a config takes: every registered ES strategy, and backprop."""
    return [*sorted(STRATEGIES), BACKPROP]


def tuned_options(task: str) -> dict:
    """The strategy options a built-in task's defaults set (for its own strategy): what older run
    directories recorded under every strategy."""
    if task.startswith(CUSTOM):
        return {}
    return split(task_spec(task).defaults, chosen_strategy(task, None), task)[1]


def is_supervised(task: str, obj=None) -> bool:
    """Whether a task (by name; a custom one by its object) has a differentiable loss and no environment."""
    if task.startswith(CUSTOM):
        return isinstance(obj, DifferentiableTask)
    return task in TASKS and TASKS[task].supervised


def torch_env_tasks() -> list[str]:
    """The built-in torch environments' tasks, whose rollouts can compile."""
    return sorted(name for name, spec in TASKS.items() if spec.env_steps is not None)


def compiling_tasks() -> list[str]:
    """The built-in tasks with a compiled path: the torch environments' rollouts, and the generation tasks'
    population decode (the tasks whose options are prompt options)."""
    from ...tasks.reward_tasks import PromptOptions

    return sorted(name for name, spec in TASKS.items()
                  if spec.env_steps is not None or issubclass(spec.options, PromptOptions))


def compiles(cfg) -> bool:
    """Whether a resolved config's rollouts run compiled (``compile``: on, off, or auto by the run's size and
    its time budget)."""
    if cfg.compile != "auto":
        return cfg.compile == "on"
    return _large(cfg) and (cfg.time_budget is None or cfg.time_budget >= COMPILE_MIN_BUDGET)


def _large(cfg) -> bool:
    """Whether a built-in torch environment's run makes enough environment steps to compile (--compile auto)."""
    if cfg.task not in torch_env_tasks():
        return False
    episodes = cfg.task_options.episodes  # a torch environment's task is an RL task
    return cfg.steps * cfg.population * episodes * TASKS[cfg.task].env_steps >= COMPILE_MIN_ENV_STEPS


def budget_note(cfg, compiled: bool) -> str | None:
    """The console line of a run with a time budget whose rollouts compile, or would by their size alone:
    compiling counts inside the budget, or the budget decided against it (None: nothing compiles)."""
    if cfg.time_budget is None:
        return None
    if compiled:
        return f"compiling counts inside --time-budget {cfg.time_budget:g} s (the first step waits for it)"
    if cfg.compile == "auto" and _large(cfg):
        return (f"--time-budget {cfg.time_budget:g} s decides against compiling the rollouts (compiling takes "
                f"10 s to over a minute on a busy CPU; auto compiles under a budget of {COMPILE_MIN_BUDGET:g} s or "
                f"more): they run eagerly (--compile on compiles them anyway)")
    return None


def kept_compile(cfg, recorded: bool | None, old: dict) -> tuple[bool, str | None]:
    """A resumed run's compile decision, and a console line when it is not what its new options alone decide.
    Under --compile auto it keeps its start's decision (``recorded`` in its checkpoint), so that it goes on bit
    for bit; an older checkpoint that did not record it takes what its own config (``old``: its --steps, time
    budget and --compile) decided, and says so. --compile on or off decides as it says."""
    now = compiles(cfg)
    if cfg.compile != "auto" or cfg.task not in torch_env_tasks():
        return now, None
    how = {True: "compiled", False: "eagerly"}
    if recorded is None:
        steps, budget = old.get("steps"), old.get("time_budget")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or not (
                budget is None or isinstance(budget, (int, float)) and not isinstance(budget, bool)):
            return now, None  # a checkpoint that resume refuses (or one of no config): decided as for a new run
        compile = old.get("compile") if old.get("compile") in ("on", "off") else "auto"
        kept = compiles(dataclasses.replace(cfg, steps=steps, time_budget=budget, compile=compile))
        return kept, (f"the checkpoint does not record whether the rollouts ran compiled (an older nesgpu): they "
                      f"run {how[kept]}, as its --steps {steps} decided (--compile on|off to choose)")
    kept = bool(recorded)
    if kept == now:
        return kept, None
    return kept, (f"the rollouts ran {how[kept]} from the run's start and go on {how[kept]}, bit for bit (--steps "
                  f"{cfg.steps} alone would run them {how[now]}, as an uninterrupted run of {cfg.steps} steps does: "
                  f"its floats differ from this run's; --compile on|off to choose)")


__all__ = ["BACKPROP", "CUSTOM", "TASK_DEFAULTS", "budget_note", "chosen_strategy", "compiles", "compiling_tasks", "is_supervised",
           "kept_compile", "kind_choices", "preset_parts", "presets", "strategy_choices", "torch_env_tasks", "tuned_options"]
