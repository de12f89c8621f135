"""``nesgpu compare``: two configurations side by side on one task and model, under the same wall-clock budget:
ES and backprop (the default), or any two (``--a`` and ``--b``: two strategies, two population sizes, ...).

Every run is a real run directory (``DIR/<label>-seed<k>``, the label being the run's strategy) trained by
:func:`~nesgpu.train.train` with ``time_budget`` and time-based evaluations, so the two configurations see the
same task, model, initial weights (the same seed), data stream, machine and seconds, and both are scored by
the task's one evaluation (its metric: test accuracy, mean return). The result: ``DIR/compare.md`` (a
Markdown table) and ``DIR/compare.png`` (the metric against wall time and against training samples drawn).
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import shlex
import statistics
import sys
from pathlib import Path

from ..train.setup.config import BACKPROP, TrainConfig, option_names
from ..train.setup.own_task import resolve_for
from ..train.storage.rundir import is_run_directory

# what compare sets in every run; a strategy's config file may not
_SET_BY_COMPARE = ("task", "seed", "out", "time_budget", "eval_every", "eval_seconds", "steps", "strategy")
STEP_CAP = 10_000_000  # steps are not the limit: the budget is
# the model both sides train: set once for both (compare's own options, or ``shared``), never per side
MODEL_OPTIONS = ("model", "hidden", "init")


def _overrides(values: dict | None, which: str) -> dict:
    values = dict(values or {})
    fixed = sorted(set(values) & set(_SET_BY_COMPARE) - ({"strategy"} if which != BACKPROP else set()))
    if fixed:
        raise ValueError(f"the {which} config sets {fixed}, which compare sets itself (use its own options)")
    own_model = [name for name in MODEL_OPTIONS if name in values]
    if own_model:
        raise ValueError(f"the {which} config sets {own_model}: both sides of a comparison train the same model, "
                         f"so give it once for both (compare's --model/--hidden, or shared=)")
    if which == "es" and values.get("strategy") == BACKPROP:
        raise ValueError("the es config chooses strategy 'backprop'; expected an ES strategy")
    return values


def _sides(es: dict | None, backprop: dict | None, a: dict | None, b: dict | None) -> list[dict]:
    """The options of the two sides: ``a`` and ``b`` when given, else the ES side's and the backprop side's."""
    if a is None and b is None:
        return [_overrides(es, "es"), {**_overrides(backprop, BACKPROP), "strategy": BACKPROP}]
    if a is None or b is None:
        raise ValueError(f"a comparison of two configurations takes both a and b (--a and --b); got only "
                         f"{'a' if b is None else 'b'}")
    if es is not None or backprop is not None:
        raise ValueError("a and b are the two configurations, in place of es and backprop; give a and b, or es "
                         "and backprop")
    return [_overrides(a, "a"), _overrides(b, "b")]


def run_configs(task, budget: float, seeds: list[int], out: Path, shared: dict | None = None,
                es: dict | None = None, backprop: dict | None = None, evals: int = 20, a: dict | None = None,
                b: dict | None = None) -> list[TrainConfig]:
    """The resolved configs of every run, side A then side B for each seed (validated before any run starts):
    ES then backprop, or ``a`` then ``b`` when they are given. ``task``: a built-in task's name, or a task
    object of your own. Each run's directory is ``out/<label>-seed<k>``, its label its strategy (with -a and -b
    after it where both sides train the same strategy)."""
    own = None if isinstance(task, str) else task
    if not budget > 0:
        raise ValueError(f"the time budget must be a positive number of seconds; got {budget}")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds must be distinct numbers >= 0; got {seeds}")
    if evals < 1:
        raise ValueError(f"evals must be >= 1; got {evals}")
    shared = dict(shared or {})
    sides = _sides(es, backprop, a, b)
    if a is None:
        _check_differentiable(task)
    names = ("es", BACKPROP) if a is None else ("a", "b")
    configs = []
    for seed in seeds:
        for which, extra in zip(names, sides):
            named = {"task": task} if own is None else {}  # a task of your own is labelled by resolve_for
            values = {**shared, **extra, **named, "seed": seed, "time_budget": float(budget),
                      "steps": STEP_CAP, "eval_every": STEP_CAP, "eval_seconds": budget / evals}
            configs.append(resolve_for(TrainConfig.from_dict(values, source=f"{which} config"), own))
    same = configs[0].strategy == configs[1].strategy
    for k, cfg in enumerate(configs):
        label = f"{cfg.strategy}-{'ab'[k % 2]}" if same else cfg.strategy
        cfg.out = str(out / f"{label}-seed{cfg.seed}")
    return configs


def _check_differentiable(task) -> None:
    """ES against backprop needs a loss to differentiate: a built-in task without one is refused, with what
    compares two configurations of it instead (a task of your own is checked when the config is resolved)."""
    from ..tasks import TASKS, supervised_tasks, task_key

    if isinstance(task, str) and task_key(task) in TASKS and task not in supervised_tasks():
        raise ValueError(f"ES against backprop needs one of the supervised tasks {supervised_tasks()}; task {task!r} "
                         f"has no differentiable loss. Compare two configurations of it instead: nesgpu compare "
                         f"--task {task} --a '--strategy snes' --b '--strategy openai_es' (compare(a=..., b=...))")


def _label(cfg: TrainConfig) -> str:
    """The label of a run's side: its directory's name without the seed."""
    return Path(cfg.out).name.rsplit("-seed", 1)[0]


def _metric_of(task) -> str | None:
    """The metric a task is scored by, where it is known before a run (a task object's, a built-in supervised
    or RL task's); None: known from the first run's summary."""
    from ..tasks import TASKS, supervised_tasks, task_key
    from ..tasks.rl_options import RLOptions

    if not isinstance(task, str):
        return task.metric
    if task in supervised_tasks():
        return "test_accuracy"
    spec = TASKS.get(task_key(task) or "")
    return "eval_return" if spec is not None and issubclass(spec.options, RLOptions) else None


def compare(task="digits", budget: float = 60.0, seeds: list[int] = (0,), out: str | Path = "compare",
            shared: dict | None = None, es: dict | None = None, backprop: dict | None = None, evals: int = 20,
            overwrite: bool = False, log=None, model=None, a: dict | None = None, b: dict | None = None) -> dict:
    """Train two configurations for ``budget`` seconds each per seed, score both by the task's evaluation,
    and write the table and plot (the table is returned, not printed: ``print(result["table"])``).

    Args:
        task: a built-in task's name, or your own task object (shared by the runs); ES against backprop needs a
            supervised one (a :class:`~nesgpu.tasks.protocol.DifferentiableTask`).
        budget: wall-clock seconds of training per run (evaluations included).
        seeds: one run of each side each.
        out: the directory of the runs and the results.
        shared: options of both runs (model, hidden, batch_size, device, init, precision, ...).
        es, backprop: options of one side of ES against backprop (e.g. {"strategy": "pgpe", "population": 256}
            / {"lr": 3e-3}); the model (model, hidden, init) is shared, never set per side.
        evals: evaluations per run, evenly spaced in time.
        overwrite: replace earlier runs in ``out``.
        model: your own model (an nn.Module): every run trains a fresh copy of it.
        a, b: any two configurations instead of ES and backprop, each a dict of options (e.g.
            {"strategy": "snes"} and {"strategy": "openai_es", "population": 256}; either may be backprop).

    Returns:
        {"table": the Markdown text, "runs": one summary per run, with its label and curve}.
    """
    from ..train.trainer import Interrupted, train

    out = Path(out)
    configs = run_configs(task, budget, list(seeds), out, shared, es, backprop, evals, a, b)
    taken = [cfg.out for cfg in configs if is_run_directory(Path(cfg.out))]
    if taken and not overwrite:
        raise ValueError(f"{out} holds the runs of an earlier compare ({', '.join(taken)}); pass --overwrite to "
                         f"replace them, or choose another --out")
    log = log or (lambda *a, **k: print(*a, file=sys.stderr, **k))
    runs = []
    metric = _metric_of(task)
    for cfg in configs:
        label = _label(cfg)
        log(f"compare: {label}, seed {cfg.seed}, {budget:g} s -> {cfg.out}")
        try:
            summary = train(cfg, overwrite=overwrite, log=lambda *a, **k: None, callback=_progress(cfg, metric, log),
                            model=None if model is None else copy.deepcopy(model),
                            task=None if isinstance(task, str) else task)
        except Interrupted as e:  # a compare is not resumed: each run must get its whole budget in one go
            e.args = (f"interrupted: the {label} run of seed {cfg.seed} stopped at step {e.step}; a comparison "
                      f"cannot be resumed (every run gets its budget at once): run compare again with --overwrite",)
            raise
        metric = summary["metric"]
        runs.append({**summary, "label": label, "curve": _curve(Path(cfg.out), metric, cfg, task)})
    given = dict(zip((_label(cfg) for cfg in configs), _sides(es, backprop, a, b)))
    table = _table(runs, budget, given)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table)
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    _plot(runs, out / "compare.png")
    log(f"compare: the table is in {out / 'compare.md'}, the plot in {out / 'compare.png'}")
    return {"table": table, "runs": runs}


def _progress(cfg: TrainConfig, metric: str | None, log):
    """A run's callback: one line per evaluation (the seconds of its budget, the step and the metric)."""
    def show(step: int, row: dict) -> bool:
        if metric is not None and row.get(metric) is not None:
            log(f"  {_label(cfg)} seed {cfg.seed}: {row['seconds']:.0f} of {cfg.time_budget:g} s, step {step}, "
                f"{metric} {row[metric]:.4f}")
        return False
    return show


def _samples_per_step(cfg: TrainConfig, task) -> int | None:
    """Training samples drawn per step: the minibatch (every ES member sees the same one), times the
    micro-batches of a backprop step. A task of your own: its ``batch_size``, if it has one (else None:
    unknown)."""
    batch = cfg.option("batch_size")
    batch = batch if batch is not None else getattr(task, "batch_size", None)
    if not isinstance(batch, int):
        return None
    return batch * (cfg.option("accumulate") if cfg.strategy == BACKPROP else 1)


def _curve(run: Path, metric: str, cfg: TrainConfig, task) -> list[tuple[float, int | None, float]]:
    """(seconds, samples drawn (None: unknown; an RL run's: its environment steps), metric) at every
    evaluation of a run."""
    with open(run / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get(metric)]
    per_step = _samples_per_step(cfg, task)

    def drawn(r: dict) -> int | None:
        if per_step is not None:
            return int(r["step"]) * per_step
        return int(float(r["env_steps"])) if r.get("env_steps") and float(r["env_steps"]) > 0 else None
    return [(float(r["seconds"]), drawn(r), float(r[metric])) for r in rows]


def _table(runs: list[dict], budget: float, given: dict[str, dict] | None = None) -> str:
    """The Markdown table: one row per side, and the options each side was given."""
    metric = runs[0]["metric"]
    lines = [f"Task {runs[0]['task']}, {budget:g} s of training per run, {len({r['seed'] for r in runs})} seed(s).", ""]
    for label, options in (given or {}).items():  # the strategy is in the label
        shown = ", ".join(f"{k}={v}" for k, v in options.items() if k != "strategy") or "its defaults"
        lines += [f"- {label}: {shown}"] + ([""] if label == list(given)[-1] else [])
    lines += [f"| configuration | runs | final {metric} (mean ± sd) | steps (mean) | samples drawn (mean) "
              f"| seconds (mean) |",
              "|---|---:|---:|---:|---:|---:|"]
    for strategy in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == strategy]
        values = [r["value"] for r in mine]
        drawn = [r["curve"][-1][1] if r["curve"] else 0 for r in mine]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(f"| {strategy} | {len(mine)} | {statistics.mean(values):.4f} ± {sd:.4f} | "
                     f"{statistics.mean(r['steps'] for r in mine):.0f} | "
                     f"{'n/a' if None in drawn else format(statistics.mean(drawn), '.0f')} | "
                     f"{statistics.mean(r['seconds'] for r in mine):.1f} |")
    return "\n".join(lines) + "\n"


def _plot(runs: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return  # the table and runs.json carry the results; the train extra brings matplotlib
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colours = {}
    for r in runs:
        colour = colours.setdefault(r["label"], f"C{len(colours)}")
        seconds, samples, values = zip(*r["curve"]) if r["curve"] else ((), (), ())
        label = r["label"] if sum(x["label"] == r["label"] for x in runs[:runs.index(r) + 1]) == 1 else None
        axes[0].plot(seconds, values, color=colour, label=label, marker=".")
        if None not in samples:  # a task of your own without a batch_size: samples unknown
            axes[1].plot(samples, values, color=colour, marker=".")
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel("training samples drawn")
    axes[1].set_xscale("log")
    axes[0].set_ylabel(runs[0]["metric"])
    axes[0].legend()
    fig.suptitle(f"{runs[0]['task']}: {' and '.join(colours)} under the same budget")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds like 0,1,2; got {text!r}") from None


class _SideParser(argparse.ArgumentParser):
    """The parser of one side's train flags: a mistake is a ValueError (one line from the CLI), not a usage."""

    def error(self, message):
        raise ValueError(f"{self.prog}: {message}")


def side_options(text: str, task: str, flag: str = "--a") -> dict:
    """The options of one side given on compare's command line: ``nesgpu train`` flags in one string
    (``"--strategy snes --population 32"``), or a YAML file of options; those it sets, by name."""
    from .train_flags import add_config_arguments, chosen

    words = shlex.split(text)
    if len(words) == 1 and words[0].endswith((".yaml", ".yml", ".json")):
        return TrainConfig.read_yaml(words[0])
    parser = _SideParser(prog=f"{flag} {text!r}", add_help=False, allow_abbrev=False)
    add_config_arguments(parser, chosen([*words, "--task", task]))
    given = vars(parser.parse_args(words))
    values = {k: v for k, v in given.items() if k in option_names() and v is not None}
    layer = {k.split(":", 1)[1]: v for k, v in given.items() if k.startswith("layer_option:") and v is not None}
    return {**values, "layer_options": layer} if layer else values


def add_compare_parser(commands) -> None:
    from .train_flags import hidden_sizes

    p = commands.add_parser("compare", help="two configurations (by default ES and backprop) side by side under "
                            "one wall-clock budget", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--task", default="digits", help="the task (default: digits; ES against backprop needs a "
                                                    "supervised one)")
    p.add_argument("--time-budget", "--budget", dest="budget", type=float, default=60.0,
                   help="seconds of training per run, as train's --time-budget (default: 60)")
    p.add_argument("--seeds", type=_seeds, default=[0], help="comma-separated seeds, one run of each side each "
                                                               "(default: 0)")
    p.add_argument("--a", metavar="OPTIONS", help='one configuration, compared with --b instead of ES with '
                   'backprop: train flags in one quoted string ("--strategy snes --population 32") or a YAML file')
    p.add_argument("--b", metavar="OPTIONS", help='the other configuration (e.g. "--strategy openai_es")')
    p.add_argument("--model", help="architecture (default: the task's)")
    p.add_argument("--hidden", type=hidden_sizes, metavar="N,N", help="hidden sizes (default: the task's)")
    p.add_argument("--batch-size", type=int, help="samples per step (default: the task's)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--es-config", help="YAML of the ES run's options (strategy, population, sigma, lr, ...)")
    p.add_argument("--backprop-config", help="YAML of the backprop run's options (lr, optimizer, precision, ...)")
    p.add_argument("--evals", type=int, default=20, help="evaluations per run, evenly spaced in time (default: 20)")
    p.add_argument("--out", default="compare", help="directory of the runs and results (default: compare)")
    p.add_argument("--overwrite", action="store_true", help="replace the runs of an earlier compare in --out")
    p.set_defaults(func=_main)


def _main(args) -> int:
    shared = {k: v for k, v in (("model", args.model), ("hidden", args.hidden), ("batch_size", args.batch_size),
                                ("device", args.device)) if v is not None}
    es = TrainConfig.read_yaml(args.es_config) if args.es_config else None
    bp = TrainConfig.read_yaml(args.backprop_config) if args.backprop_config else None
    a, b = (None if text is None else side_options(text, args.task, flag)
            for text, flag in ((args.a, "--a"), (args.b, "--b")))
    if (a, b) != (None, None) and (es, bp) != (None, None):
        raise ValueError("--a and --b are the two configurations, in place of --es-config and --backprop-config; "
                         "give one pair")
    result = compare(args.task, args.budget, args.seeds, args.out, shared, es, bp, args.evals, args.overwrite,
                     a=a, b=b)
    print(result["table"], end="")
    return 0


__all__ = ["compare", "run_configs", "side_options"]
