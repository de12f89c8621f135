"""Where a run's unset options come from: global defaults < the task's own (declared by each task module in
the registry, ``nesgpu.tasks.TASKS``) < its model's; a strategy other than the task's starts from its own
step size. Nothing here is per task: adding a task touches nothing in train/."""

from __future__ import annotations

from ...strategies import STRATEGIES
from ...tasks import TASKS, DifferentiableTask, task_spec
from .options import BACKPROP, STRATEGY, TASK, task_key

# the gradient baseline is a strategy name of the config, so a run differs from an ES run by one option; its
# step size is AdamW's own (its other options are BackpropOptions')
BACKPROP_DEFAULTS = dict(lr=1e-3)
# the options of ES runs only (each an error, when set, under backprop); each strategy's own options are its
# Options' (nesgpu.train.setup.options)
ES_ONLY = ("population", "sigma", "layer", "layer_options", "bits", "noise_on", "act_bits", "antithetic", "anchor",
           "evolve", "sigma_schedule", "sigma_final", "chunk_size", "compile", "dtype", "update")
# what neither the task nor its model sets
GLOBAL_DEFAULTS = dict(strategy="openai_es", lr_schedule="constant", lr_final=1.0, antithetic=True,
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


def presets(task: str, model: str | None = None, strategy: str | None = None) -> dict:
    """The defaults a run of ``task`` (with ``model`` and ``strategy``, None: the task's own) starts from:
    global defaults < the task's < its model's. The task's tuned step size and update hold for its own strategy;
    another strategy starts from its own optimizer (``update="strategy"``) and ``default_lr``. A custom
    task starts from ``CUSTOM_DEFAULTS`` (its own defaults are set in the config first: ``labelled``)."""
    if task.startswith(CUSTOM):
        values = {**GLOBAL_DEFAULTS, **CUSTOM_DEFAULTS}
        values["model"] = model or values["model"]
    else:
        spec = task_spec(task)
        model = model or spec.models[0]
        values = {**GLOBAL_DEFAULTS, **TASK.defaults_of(task_key(task)), **spec.defaults,
                  **spec.model_defaults.get(model, {}), "model": model}
    own = values["strategy"]  # the strategy the task's values were tuned for
    tuned = {name: values.pop(name) for name in STRATEGY.names() if name in values}
    if strategy is not None and strategy != values["strategy"]:
        if strategy == BACKPROP:
            values.update(strategy=strategy, **BACKPROP_DEFAULTS)
        elif strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; expected one of {strategy_choices()}")
        else:
            # a sigma from the probe takes the strategy's own rule for lr (auto); else its own default
            lr = "auto" if values.get("lr") == "auto" else STRATEGIES[strategy].default_lr
            values.update(strategy=strategy, lr=lr, update="strategy")  # its own optimizer, as its own lr
    # the strategy's options: its own defaults, less what the task tuned for it (for its own strategy only)
    values.update(STRATEGY.defaults_of(values["strategy"]))
    if not getattr(STRATEGIES.get(values["strategy"]), "default_antithetic", True):  # CMA-ES: independent members
        values["antithetic"] = False
    values.update({k: v for k, v in tuned.items() if values["strategy"] == own and k in values})
    run_defaults = None if task.startswith(CUSTOM) else getattr(task_spec(task).options, "run_defaults", None)
    if run_defaults is not None:  # the task's defaults that depend on the strategy (RL: its observation clip)
        values.update(run_defaults(STRATEGIES.get(values["strategy"])))
    return values


def strategy_choices() -> list[str]:
    """The strategy names a config takes: every registered ES strategy, and backprop."""
    return [*sorted(STRATEGIES), BACKPROP]


def tuned_options(task: str) -> dict:
    """The strategy options a built-in task's defaults set (for its own strategy): what older run
    directories recorded under every strategy."""
    if task.startswith(CUSTOM):
        return {}
    spec = task_spec(task)
    return {name: value for name, value in spec.defaults.items() if name in STRATEGY.names()}


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
    """Whether a resolved config's rollouts run compiled (``compile``: on, off, or auto by the run's size)."""
    if cfg.compile != "auto":
        return cfg.compile == "on"
    if cfg.task not in torch_env_tasks():
        return False
    episodes = cfg.task_options.episodes  # a torch environment's task is an RL task
    return cfg.steps * cfg.population * episodes * TASKS[cfg.task].env_steps >= COMPILE_MIN_ENV_STEPS


__all__ = ["BACKPROP", "CUSTOM", "TASK_DEFAULTS", "compiles", "compiling_tasks", "is_supervised", "presets",
           "strategy_choices", "torch_env_tasks", "tuned_options"]
