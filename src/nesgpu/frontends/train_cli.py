"""``nesgpu train`` and ``nesgpu eval``: the command line generated from TrainConfig and the chosen
components' options (:mod:`nesgpu.frontends.train_flags`)."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from ..train.setup.component_options import KEYS
from ..train.setup.config import TrainConfig, option_names, presets
from ..train.setup.defaults import BACKPROP, ES_ONLY
from ..train.setup.old_runs import resumed
from .help_flag import add_help_flag
from .run_code import add_trust_flag, consent_to_run_code, run_config
from .train_flags import Formatter, add_config_arguments, chosen, preset_components

USAGE = "nesgpu train [--task TASK] [--strategy STRATEGY] [--layer KIND] [options]"


def add_train_parser(commands, argv: list[str] | None = None) -> None:
    """Register ``nesgpu train`` for the components ``argv`` (its arguments) names (see
    :mod:`nesgpu.frontends.train_flags`)."""
    c = chosen(argv or [])
    p = commands.add_parser("train", help="train a model with ES (default: digits, low-rank MLP)", usage=USAGE,
                            formatter_class=Formatter, add_help=False,
                            description=f"Train with evolution strategies. The options of task {c.task} below, "
                                        f"with its defaults (--task T --strategy S --help: those of T and S).")
    add_help_flag(p, argv or [])  # an unknown --task: --help names the error (there are no options to list)
    add_config_arguments(p, c)
    run = p.add_argument_group("run")
    run.add_argument("--config", metavar="FILE.yaml", help="options from a YAML or JSON file (as --print-config "
                                                           "writes)")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR up to --steps")
    run.add_argument("--overwrite", action="store_true", help="replace the run already in --out (else refused)")
    add_trust_flag(run, "with --resume: ")
    run.add_argument("--print-config", action="store_true", dest="print_config",
                     help="print the resolved options as YAML and exit")
    p.set_defaults(func=run_train)


def _check_es_only(given: dict, strategy: str | None, task: str) -> None:
    """An ES option given as a flag under backprop is an error, even at its default value (TrainConfig can only
    tell a value from its default; a flag is the user's own word). Another component's option is no flag here
    (``train_flags.foreign_flag``)."""
    mine = strategy or presets(task)["strategy"]
    hint = "" if strategy else " (the task's default)"
    wrong = [name for name in given if mine == BACKPROP and name in ES_ONLY]
    if wrong:
        raise ValueError(f"option {wrong[0]!r} (= {given[wrong[0]]!r}) applies to the ES strategies, not to "
                         f"strategy {mine!r}{hint}; drop it or choose an ES strategy")


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, bool]:
    """Defaults < the resumed run's config < --config file < flags."""
    old: dict = {}
    # the keys a --config file sets, each type-checked (a value equal to a default still counts)
    from_file = TrainConfig.read_yaml(args.config) if args.config else {}
    fields = set(option_names())
    flags = {key: value for key, value in vars(args).items() if key in fields and value is not None}
    for side in KEYS.values():  # a name both chosen components take: --strategy-NAME, --task-NAME
        given = {key.partition(":")[2]: value for key, value in vars(args).items()
                 if key.startswith(side + ":") and value is not None}
        if given:
            flags[side] = given
    if args.resume:
        recorded = run_config(Path(args.resume))
        if recorded is None:
            raise ValueError(f"--resume {args.resume}: no config.json there; is it a run directory?")
        if args.out is not None and Path(args.out) != Path(args.resume):
            raise ValueError(f"--resume {args.resume} continues the run in that directory; --out {args.out} names "
                             f"another (drop --out)")
        old = {**resumed(recorded, Path(args.resume), optional={*from_file, *flags}), "out": args.resume}
    values = {**old, **from_file}
    # a flag of the other side is refused even at its default (a config file lists every option: --print-config)
    task = flags.get("task", values.get("task", "digits"))
    preset = flags.get("preset", values.get("preset"))
    strategy = flags.get("strategy", values.get("strategy"))
    _check_es_only(flags, strategy or (preset_components(preset, task).get("strategy") if preset else None), task)
    options = {key.split(":", 1)[1]: value for key, value in vars(args).items()
               if key.startswith("layer_option:") and value is not None}
    if options:
        flags["layer_options"] = {**values.get("layer_options", {}), **options}
    if args.resume:  # a config file's or a flag's out cannot send the resumed run elsewhere
        out = flags.get("out", values.get("out"))
        if out is not None and Path(out) != Path(args.resume):
            raise ValueError(f"--resume {args.resume} continues the run in that directory; the options name out "
                             f"{out} (drop it from the config file)")
        flags["out"] = args.resume
    return TrainConfig.from_layers(old, from_file, flags, source="options"), bool(args.resume)


def run_train(args: argparse.Namespace) -> int:
    from ..train.trainer import train

    if args.resume:  # a run directory someone sent you to continue names code too
        consent_to_run_code(Path(args.resume), args.trust_run_code, "train")
    cfg, resume = config_from_args(args)
    if args.print_config:
        print(cfg.resolved().to_yaml(), end="")
        return 0
    summary = train(cfg, resume=resume, overwrite=args.overwrite)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 speaks for the job
        print(json.dumps(summary))
    return 0


def add_eval_parser(commands) -> None:
    p = commands.add_parser("eval", help="evaluate a finished run's model",
                            description="Evaluate DIR/model.safetensors "
                            "on its task (test accuracy or mean return) and print JSON.")
    p.add_argument("run", metavar="DIR")
    p.add_argument("--device", default="auto")
    p.add_argument("--task", metavar="MODULE:NAME", help="a run of a task of your own: the task (an object with "
                   "fitness and evaluate, or what makes one when called), as module:name or file.py:name")
    p.add_argument("--model", metavar="MODULE:NAME", help="a run of a model of your own (unless the task makes "
                   "it): the model, or what makes one when called, as module:name or file.py:name")
    add_trust_flag(p, "")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from torch import nn

    from ..train.storage.runs import evaluate_run

    consent_to_run_code(Path(args.run), args.trust_run_code, "eval")
    task = None if args.task is None else own_object(args.task, "--task", lambda o: hasattr(o, "fitness"))
    model = None if args.model is None else own_object(args.model, "--model", lambda o: isinstance(o, nn.Module))
    result = evaluate_run(args.run, args.device, model=model, task=task)
    # JSON has no NaN (a std of one held-out prompt): null
    print(json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in result.items()}))
    return 0


def own_object(spec: str, flag: str, made):
    """The object ``spec`` (module:name) names, or what it returns when called with no arguments, if it is
    not yet ``made`` (a class or a function that makes a task or model)."""
    from ..tasks.user_code import load_object

    found = load_object(spec, flag, kind=flag.removeprefix("--"))
    if not made(found) and callable(found):
        found = found()
    if not made(found):
        raise TypeError(f"{flag} {spec}: expected a {flag.removeprefix('--')}, or what makes one when called; got "
                        f"{type(found).__name__}")
    return found


__all__ = ["add_eval_parser", "add_train_parser", "config_from_args"]
