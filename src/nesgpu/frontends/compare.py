"""``nesgpu compare``: ES and backprop side by side on one task and model, under the same wall-clock budget.

Every run is a real run directory (``DIR/<strategy>-seed<k>``) trained by :func:`~nesgpu.train.train` with
``time_budget`` and time-based evaluations, so the two strategies see the same task, model, initial weights
(the same seed), data stream, machine and seconds. The result: ``DIR/compare.md`` (a Markdown table) and
``DIR/compare.png`` (the metric against wall time and against training samples drawn).
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import statistics
import sys
from pathlib import Path

from ..train.setup.config import BACKPROP, TrainConfig, resolve_for
from ..train.storage.rundir import is_run_directory

# what compare sets in every run; a strategy's config file may not
_SET_BY_COMPARE = ("task", "seed", "out", "time_budget", "eval_every", "eval_seconds", "steps", "strategy")
STEP_CAP = 10_000_000  # steps are not the limit: the budget is
# the model both sides train: set once for both (compare's own options, or ``shared``), never per side
MODEL_OPTIONS = ("model", "hidden", "init")


def _overrides(values: dict | None, which: str) -> dict:
    values = dict(values or {})
    fixed = sorted(set(values) & set(_SET_BY_COMPARE) - ({"strategy"} if which == "es" else set()))
    if fixed:
        raise ValueError(f"the {which} config sets {fixed}, which compare sets itself (use its own options)")
    own_model = [name for name in MODEL_OPTIONS if name in values]
    if own_model:
        raise ValueError(f"the {which} config sets {own_model}: both sides of a comparison train the same model, "
                         f"so give it once for both (compare's --model/--hidden, or shared=)")
    if which == "es" and values.get("strategy") == BACKPROP:
        raise ValueError("the es config chooses strategy 'backprop'; expected an ES strategy")
    return values


def run_configs(task, budget: float, seeds: list[int], out: Path, shared: dict | None = None,
                es: dict | None = None, backprop: dict | None = None, evals: int = 20) -> list[TrainConfig]:
    """The resolved configs of every run: ES then backprop for each seed (validated before any run starts).
    ``task``: a built-in task's name, or a task object of your own."""
    own = None if isinstance(task, str) else task
    if not budget > 0:
        raise ValueError(f"the time budget must be a positive number of seconds; got {budget}")
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds must be distinct numbers >= 0; got {seeds}")
    if evals < 1:
        raise ValueError(f"evals must be >= 1; got {evals}")
    shared = dict(shared or {})
    configs = []
    for seed in seeds:
        for which, extra in (("es", _overrides(es, "es")), (BACKPROP, _overrides(backprop, BACKPROP))):
            named = {"task": task} if own is None else {}  # a task of your own is labelled by resolve_for
            values = {**shared, **extra, **named, "seed": seed, "time_budget": float(budget),
                      "steps": STEP_CAP, "eval_every": STEP_CAP, "eval_seconds": budget / evals}
            if which == BACKPROP:
                values["strategy"] = BACKPROP
            cfg = resolve_for(TrainConfig.from_dict(values, source=f"{which} config"), own)
            cfg.out = str(out / f"{cfg.strategy}-seed{seed}")
            configs.append(cfg)
    return configs


def compare(task="digits", budget: float = 60.0, seeds: list[int] = (0,), out: str | Path = "compare",
            shared: dict | None = None, es: dict | None = None, backprop: dict | None = None, evals: int = 20,
            overwrite: bool = False, log=None, model=None) -> dict:
    """Train ES and backprop for ``budget`` seconds each per seed and write the table and plot.

    Args:
        task: a supervised task: a built-in one's name, or your own task object (a
            :class:`~nesgpu.tasks.protocol.DifferentiableTask`, shared by the runs).
        budget: wall-clock seconds of training per run (evaluations included).
        seeds: one ES and one backprop run each.
        out: the directory of the runs and the results.
        shared: options of both runs (model, hidden, batch_size, device, init, precision, ...).
        es, backprop: options of one side (e.g. {"strategy": "pgpe", "population": 256} / {"lr": 3e-3}); the
            model (model, hidden, init) is shared, never set per side.
        evals: evaluations per run, evenly spaced in time.
        overwrite: replace earlier runs in ``out``.
        model: your own model (an nn.Module): every run trains a fresh copy of it.

    Returns:
        {"table": the Markdown text, "runs": one summary per run, with its curve}.
    """
    from ..train.trainer import Interrupted, train

    out = Path(out)
    configs = run_configs(task, budget, list(seeds), out, shared, es, backprop, evals)
    taken = [cfg.out for cfg in configs if is_run_directory(Path(cfg.out))]
    if taken and not overwrite:
        raise ValueError(f"{out} holds the runs of an earlier compare ({', '.join(taken)}); pass --overwrite to "
                         f"replace them, or choose another --out")
    log = log or (lambda *a, **k: print(*a, file=sys.stderr, **k))
    runs = []
    metric = "test_accuracy" if isinstance(task, str) else task.metric  # compare's tasks are supervised
    for cfg in configs:
        log(f"compare: {cfg.strategy}, seed {cfg.seed}, {budget:g} s -> {cfg.out}")
        try:
            summary = train(cfg, overwrite=overwrite, log=lambda *a, **k: None, callback=_progress(cfg, metric, log),
                            model=None if model is None else copy.deepcopy(model),
                            task=None if isinstance(task, str) else task)
        except Interrupted as e:  # a compare is not resumed: each run must get its whole budget in one go
            e.args = (f"interrupted: the {cfg.strategy} run of seed {cfg.seed} stopped at step {e.step}; a comparison "
                      f"cannot be resumed (every run gets its budget at once): run compare again with --overwrite",)
            raise
        runs.append({**summary, "curve": _curve(Path(cfg.out), summary["metric"], cfg, task)})
    table = _table(runs, budget)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table)
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    _plot(runs, out / "compare.png")
    log(table)
    return {"table": table, "runs": runs}


def _progress(cfg: TrainConfig, metric: str, log):
    """A run's callback: one line per evaluation (the seconds of its budget, the step and the metric)."""
    def show(step: int, row: dict) -> bool:
        if row.get(metric) is not None:
            log(f"  {cfg.strategy} seed {cfg.seed}: {row['seconds']:.0f} of {cfg.time_budget:g} s, step {step}, "
                f"{metric} {row[metric]:.4f}")
        return False
    return show


def _samples_per_step(cfg: TrainConfig, task) -> int | None:
    """Training samples drawn per step: the minibatch (every ES member sees the same one), times the
    micro-batches of a backprop step. A task of your own: its ``batch_size``, if it has one (else None:
    unknown)."""
    batch = cfg.batch_size if cfg.batch_size is not None else getattr(task, "batch_size", None)
    if not isinstance(batch, int):
        return None
    return batch * (cfg.accumulate if cfg.strategy == BACKPROP else 1)


def _curve(run: Path, metric: str, cfg: TrainConfig, task) -> list[tuple[float, int | None, float]]:
    """(seconds, samples drawn (None: unknown), metric) at every evaluation of a run."""
    with open(run / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get(metric)]
    per_step = _samples_per_step(cfg, task)
    return [(float(r["seconds"]), None if per_step is None else int(r["step"]) * per_step, float(r[metric]))
            for r in rows]


def _table(runs: list[dict], budget: float) -> str:
    metric = runs[0]["metric"]
    lines = [f"Task {runs[0]['task']}, {budget:g} s of training per run, {len({r['seed'] for r in runs})} seed(s).", "",
             f"| strategy | runs | final {metric} (mean ± sd) | steps (mean) | samples drawn (mean) "
             f"| seconds (mean) |",
             "|---|---:|---:|---:|---:|---:|"]
    for strategy in dict.fromkeys(r["strategy"] for r in runs):
        mine = [r for r in runs if r["strategy"] == strategy]
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
        colour = colours.setdefault(r["strategy"], f"C{len(colours)}")
        seconds, samples, values = zip(*r["curve"]) if r["curve"] else ((), (), ())
        label = r["strategy"] if sum(x["strategy"] == r["strategy"] for x in runs[:runs.index(r) + 1]) == 1 else None
        axes[0].plot(seconds, values, color=colour, label=label, marker=".")
        if None not in samples:  # a task of your own without a batch_size: samples unknown
            axes[1].plot(samples, values, color=colour, marker=".")
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel("training samples drawn")
    axes[1].set_xscale("log")
    axes[0].set_ylabel(runs[0]["metric"])
    axes[0].legend()
    fig.suptitle(f"{runs[0]['task']}: ES and backprop under the same budget")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds like 0,1,2; got {text!r}") from None


def add_compare_parser(commands) -> None:
    from .train_flags import hidden_sizes

    p = commands.add_parser("compare", help="ES and backprop side by side under one wall-clock budget",
                            description=__doc__.splitlines()[0].replace("``", ""))  # plain text in --help
    p.add_argument("--task", default="digits", help="a supervised task (default: digits)")
    p.add_argument("--time-budget", "--budget", dest="budget", type=float, default=60.0,
                   help="seconds of training per run, as train's --time-budget (default: 60)")
    p.add_argument("--seeds", type=_seeds, default=[0], help="comma-separated seeds, one ES and one backprop run "
                                                               "each (default: 0)")
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
    compare(args.task, args.budget, args.seeds, args.out, shared, es, bp, args.evals, args.overwrite)
    return 0


__all__ = ["compare", "run_configs"]
