"""``nesgpu tune``: the command line of :func:`nesgpu.tune.tune`. Every ``nesgpu train`` option (flags and
``--config``) sets the base config of the study; ``--out`` names the tune directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the same as nesgpu.tune.study.SAMPLERS and PRUNERS, which import Optuna (the parser must not need it)
SAMPLER_CHOICES = ("tpe", "gp", "cmaes")
PRUNER_CHOICES = ("median", "hyperband", "none")
USAGE = ("nesgpu tune --trials N --out DIR [--timeout S] [--space SPACE.yaml] [--sampler {tpe,gp,cmaes}] "
         "[--pruner {median,hyperband,none}] [--study-name NAME] [--heartbeat S] [--print-space] "
         "[any nesgpu train option]")
DESCRIPTION = """\
Bayesian search (Optuna) over nesgpu train options: each trial is a training run in DIR/trials/NNNN,
scored by the task's final metric (test_accuracy or eval_return; higher is better). The nesgpu train
options (flags, --config FILE.yaml) set the base config that every trial starts from.

search space (--space SPACE.yaml): option name -> range or choices; a name is a train option or an
option of the base config's layer kind (rank of lowrank):
  lr: {low: 1.0e-4, high: 0.1, log: true}      float range (log-uniform with log: true)
  population: {low: 64, high: 512, step: 64}   int range (low and high ints)
  hidden: {choices: ["32", "64,64"]}           choices
Each option must apply to the base config's strategy and layer kind, and the values at the edges of a
range (and every choice) must pass the config's checks. Without --space: a default space around the
base config's values (lr, sigma log-uniform 10x either side, population, weight_decay where the
strategy takes it, rank for lowrank, hidden sizes for MLPs; backprop: lr, weight_decay, batch_size);
--print-space shows it as YAML to start a file from.

study: DIR/study.db (SQLite). The same command again continues a study (a killed one too); several
processes may run on one DIR at once. --trials caps the finished (complete + pruned) trials of all
processes and sessions together. A running trial's process records a heartbeat; a trial without one for
three beats (a killed process) is marked failed. A DIR holding a study of another base config or space
is refused. A trial whose config is refused or whose run diverges is recorded as failed with its
message; Ctrl-C fails the running trial and stops (exit 130), the study stays resumable.

samplers: tpe (default) and gp model the finished trials after a third of the study (2 to 10 trials) of
random ones; cmaes adapts a Gaussian over the numeric options (choices are drawn at random). Seeded by
--seed and the trial number.
pruners: median (default; a trial below the median of earlier trials at the same evaluation is stopped,
after 5 trials), hyperband, none. Evaluations every --eval-every steps (default: a tenth of the run).

outputs in DIR: trials.csv (a row per trial), best.yaml (the best trial's full config: nesgpu train
--config DIR/best.yaml runs it), optimization_history.png, param_importances.png,
parallel_coordinate.png; a summary on stdout.

tune options are listed last, after the train options."""


def add_parser(commands, argv: list[str] | None = None) -> None:
    """Register ``nesgpu tune``: its train options are those of the components ``argv`` names
    (:func:`nesgpu.frontends.train_flags.add_config_arguments`)."""
    from ..frontends.train_flags import add_config_arguments, chosen

    # "resolve": the tune's --out (the tune directory) replaces the train option --out (a run directory)
    p = commands.add_parser("tune", help="Bayesian search over train options with Optuna", usage=USAGE,
                            description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                            conflict_handler="resolve")
    add_config_arguments(p, chosen(argv or []))
    p.add_argument("--config", metavar="FILE.yaml", help="base options from a YAML (or JSON) file, as nesgpu "
                                                         "train --print-config or a tune's best.yaml writes them")
    group = p.add_argument_group("tune")
    group.add_argument("--out", dest="tune_out", metavar="DIR", help="the tune directory (required): study.db, "
                       "trials/NNNN, trials.csv, best.yaml, plots")
    group.add_argument("--trials", type=int, metavar="N", help="stop at N finished (complete + pruned) trials, "
                       "counted over every process and session of the study")
    group.add_argument("--timeout", type=float, metavar="S", help="start no new trial after S seconds (a running "
                       "trial finishes)")
    group.add_argument("--space", metavar="SPACE.yaml", help="the search space (default: the strategy's default "
                       "space around the base config)")
    group.add_argument("--sampler", choices=SAMPLER_CHOICES, default="tpe", help="default: tpe")
    group.add_argument("--pruner", choices=PRUNER_CHOICES, default="median", help="default: median")
    group.add_argument("--study-name", metavar="NAME", help="the study's name in study.db (default: the one there, "
                       "or DIR's name)")
    group.add_argument("--heartbeat", type=int, default=10, metavar="S", help="seconds between a running trial's "
                       "heartbeats; a trial silent for three is marked failed (default: 10)")
    group.add_argument("--print-space", action="store_true", help="print the search space as YAML and exit")
    p.set_defaults(func=run_tune, resume=None, out=None)


def run_tune(args: argparse.Namespace) -> int:
    from ..frontends.train_cli import config_from_args

    base, _ = config_from_args(args)
    if args.print_space:
        return _print_space(base, args.space)
    if not args.tune_out:
        raise ValueError("--out DIR is required: the tune directory (study.db, trials/, best.yaml, plots)")
    if args.trials is None and args.timeout is None:
        raise ValueError("give --trials N, --timeout S, or both")
    try:
        import optuna  # noqa: F401
    except ImportError as e:
        raise ImportError(f"nesgpu tune needs Optuna ({e}); pip install 'nesgpu[tune]'") from None
    from ..train.trainer import Interrupted
    from .outputs import summary
    from .study import tune

    try:
        study = tune(base, args.space, args.trials, args.tune_out, sampler=args.sampler, pruner=args.pruner,
                     timeout=args.timeout, study_name=args.study_name, heartbeat=args.heartbeat)
    except (KeyboardInterrupt, Interrupted):
        print(f"nesgpu tune: interrupted; the study in {args.tune_out} keeps its finished trials: run the same "
              f"command to continue it", file=sys.stderr)
        return 130
    print("\n".join(summary(study, Path(args.tune_out))))
    return 0


def _print_space(base, space_path: str | None) -> int:
    import yaml

    from .space import make_space

    space = make_space(base, space_path)
    print(yaml.safe_dump(space.to_dict(), sort_keys=False), end="")
    return 0


__all__ = ["add_parser", "run_tune"]
