"""``nesgpu train`` and ``nesgpu eval``: the command line generated from TrainConfig, one flag per field."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

from ..layers import KINDS
from ..train.setup.config import TrainConfig, presets
from ..train.setup.defaults import BACKPROP, ES_ONLY
from ..train.setup.options import STRATEGY, TASK, task_key


def _hidden(text: str) -> tuple[int, ...]:
    """"64" or "64,64"; "0" or "" for none (a linear policy)."""
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer sizes like 64,64; got {text!r}") from None
    if sizes in ((), (0,)):
        return ()
    if any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"layer sizes must be >= 1 (or a lone 0 for none); got {text!r}")
    return sizes


def _or_auto(parse, expected: str):
    """A flag's parser: ``parse(text)``, or the text "auto"."""
    def parser(text: str):
        if text == "auto":
            return text
        try:
            return parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected} or 'auto'; got {text!r}") from None
    return parser


_chunk = _or_auto(int, "a number of directions")
_auto_float = _or_auto(float, "a number")


def _count(text: str) -> int | float:
    """A count (an int) or a fraction (a float)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a count (int) or a fraction (float); got {text!r}") from None


def _scalar_type(annotation: str):
    for name, parse in (("int | float", _count), ("int", int), ("float", float), ("str", str)):
        if annotation.startswith(name):
            return parse
    raise TypeError(f"no command-line parser for annotation {annotation!r}")  # a new field type: add it here


def _default_text(f: dataclasses.Field) -> str:
    if f.metadata.get("per_task"):
        example = presets("digits").get(f.name)
        if isinstance(example, tuple):
            example = ",".join(map(str, example))
        return f"the task's (digits: {example})" if example is not None else "the task's"
    if f.default_factory is not dataclasses.MISSING:
        return ""
    if f.default is None:
        return "none"
    return str(f.default)


def layer_option_flags() -> dict[str, tuple[str, dataclasses.Field]]:
    """``--rank``, ``--in-sparsity``, ... : every option of every layer kind, as {flag: (kind, field)}. A
    name that is short or shared by two kinds is prefixed with its kind (``--sparse-k``)."""
    names = [f.name for kind in KINDS.values() for f in dataclasses.fields(kind)]
    flags = {}
    for kind_name, kind in sorted(KINDS.items()):
        for f in dataclasses.fields(kind):
            bare = f.name if len(f.name) > 1 and names.count(f.name) == 1 else f"{kind_name}_{f.name}"
            flags["--" + bare.replace("_", "-")] = (kind_name, f)
    return flags


def _add_field(p, f: dataclasses.Field) -> None:
    """The flag of one TrainConfig field."""
    meta = f.metadata
    default = _default_text(f)
    kwargs: dict = dict(dest=f.name, default=None,
                        help=meta["help"] + (f" (default: {default})" if default and "default" not in meta["help"]
                                             else ""))
    flag = "--" + f.name.replace("_", "-")
    if f.type.split(" | ")[0] == "bool":
        p.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        return
    if meta.get("parse") == "chunk":
        kwargs["type"] = _chunk
    elif meta.get("parse") == "auto":
        kwargs["type"] = _auto_float
    elif f.type.startswith("tuple[int"):
        kwargs["type"] = _hidden
    else:
        kwargs["type"] = _scalar_type(f.type)
    if meta.get("choices"):
        kwargs["choices"] = meta["choices"]
    if meta.get("metavar"):
        kwargs["metavar"] = meta["metavar"]
    p.add_argument(flag, **kwargs)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (``batch_size`` -> ``--batch-size``), typed from its annotation, with
    its doc and default in ``--help``, the strategies' options in a group of their own; plus a flag per
    layer-kind option. Unset flags stay None, so a config file or a resumed run's options are not overridden
    by defaults."""
    groups = {"strategy": p.add_argument_group("strategy options", "options of one strategy (--strategy); each is "
                                               "an error under the others"),
              "task": p.add_argument_group("task options", "options of one task (--task); each is an error under "
                                           "the others")}
    for f in dataclasses.fields(TrainConfig):
        if f.name != "layer_options":
            _add_field(groups.get(f.metadata.get("owned_by"), p), f)
    group = p.add_argument_group("layer options", "options of one layer kind (--layer); they fill layer_options")
    for flag, (kind, f) in layer_option_flags().items():
        kwargs = dict(dest=f"layer_option:{f.name}", default=None, type=_scalar_type(f.type),
                      help=f"{kind}: {f.metadata.get('help', '')}" + ("" if "default" in f.metadata.get("help", "")
                                                                    else f" (default: {f.default})"))
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        else:
            kwargs["metavar"] = f.name.upper()
        group.add_argument(flag, **kwargs)


def add_train_parser(commands) -> None:
    p = commands.add_parser("train", help="train a model with ES (default: digits, low-rank MLP)",
                            description="Train with evolution strategies. Unset options take the task's "
                                        "defaults; a --config file sets options, and flags override it.")
    add_config_arguments(p)
    run = p.add_argument_group("run")
    run.add_argument("--config", metavar="FILE.yaml", help="options from a YAML (or JSON) file, as --print-config "
                                                           "writes them")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR up to --steps")
    run.add_argument("--overwrite", action="store_true", help="replace the run already in --out (else refused)")
    run.add_argument("--trust-reward-code", action="store_true", help="with --resume: import the reward functions "
                     "the run's config.json names even from its own directory or from outside the working directory")
    run.add_argument("--print-config", action="store_true", dest="print_config",
                     help="print the resolved options as YAML and exit")
    p.set_defaults(func=run_train)


def _check_sides(given: dict, strategy: str | None, task: str) -> None:
    """A flag of another strategy's or task's options (or an ES option under backprop) is an error, even at its
    default value (TrainConfig can only tell a value from its default; a flag is the user's own word)."""
    mine = strategy or presets(task)["strategy"]
    hint = "" if strategy else " (the task's default)"
    wrong = [name for name in given if mine == BACKPROP and name in ES_ONLY]
    if wrong:
        raise ValueError(f"option {wrong[0]!r} (= {given[wrong[0]]!r}) applies to the ES strategies, not to "
                         f"strategy {mine!r}{hint}; drop it or choose an ES strategy")
    for owners, owner, why in ((STRATEGY, mine, hint), (TASK, task_key(task), "")):
        wrong = [name for name in given if owners.owners(name) and name not in owners.defaults_of(owner)]
        if wrong:
            raise owners.refusal(wrong[0], given[wrong[0]], owner, why)


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, bool]:
    """Defaults < the resumed run's config < --config file < flags."""
    values: dict = {}
    if args.resume:
        path = Path(args.resume) / "config.json"
        if not path.is_file():
            raise ValueError(f"--resume {args.resume}: no config.json there; is it a run directory?")
        if args.out is not None and Path(args.out) != Path(args.resume):
            raise ValueError(f"--resume {args.resume} continues the run in that directory; --out {args.out} names "
                             f"another (drop --out)")
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--resume {args.resume}: cannot read {path} ({e})") from e
        if not isinstance(old, dict):
            raise ValueError(f"--resume {args.resume}: {path} holds a {type(old).__name__}, not a run's mapping of "
                             f"options")
        values.update(old)
        values["out"] = args.resume
    if args.config:  # the keys the file sets, each type-checked (a value equal to a default still counts)
        values.update(TrainConfig.read_yaml(args.config))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    flags = {key: value for key, value in vars(args).items() if key in fields and value is not None}
    # a flag of the other side is refused even at its default (a config file lists every option: --print-config)
    _check_sides(flags, flags.get("strategy", values.get("strategy")), flags.get("task", values.get("task", "digits")))
    values.update(flags)
    options = {key.split(":", 1)[1]: value for key, value in vars(args).items()
               if key.startswith("layer_option:") and value is not None}
    if options:
        values["layer_options"] = {**values.get("layer_options", {}), **options}
    if args.resume:  # a config file's or a flag's out cannot send the resumed run elsewhere
        if values.get("out") is not None and Path(values["out"]) != Path(args.resume):
            raise ValueError(f"--resume {args.resume} continues the run in that directory; the options name out "
                             f"{values['out']} (drop it from the config file)")
        values["out"] = args.resume
    return TrainConfig.from_dict(values, source="options"), bool(args.resume)


def run_train(args: argparse.Namespace) -> int:
    from ..train.trainer import train

    cfg, resume = config_from_args(args)
    if resume:  # a run directory someone sent you to continue names code too
        consent_to_rewards(Path(args.resume), args.trust_reward_code, "train")
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
    p.add_argument("--trust-reward-code", action="store_true", help="import the reward functions the run's "
                   "config.json names even from the run directory itself or from outside the working directory")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from torch import nn

    from ..train.storage.runs import evaluate_run

    consent_to_rewards(Path(args.run), args.trust_reward_code)
    task = None if args.task is None else own_object(args.task, "--task", lambda o: hasattr(o, "fitness"))
    model = None if args.model is None else own_object(args.model, "--model", lambda o: isinstance(o, nn.Module))
    result = evaluate_run(args.run, args.device, model=model, task=task)
    # JSON has no NaN (a std of one held-out prompt): null
    print(json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in result.items()}))
    return 0


def consent_to_rewards(run: Path, trusted: bool, command: str = "eval") -> None:
    """Say which files the run's reward functions (config.json's ``reward``) will be imported from: a run
    directory someone sent you is code. A file of the run directory itself, or one outside the working
    directory that is not installed Python (the standard library, site-packages), needs
    ``--trust-reward-code``."""
    from ..tasks.user_code import code_file, installed, outside

    try:  # a config.json that cannot be read is named when the run loads
        reward = json.loads((run / "config.json").read_text()).get("reward")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        return
    for spec in [s.strip() for s in reward.split(",") if s.strip()] if isinstance(reward, str) else []:
        file = code_file(spec)
        if file is None:
            continue
        where = "in the run directory" if not outside(file, run) else \
            "outside the working directory" if outside(file, Path.cwd()) and not installed(file) else None
        if where is not None and not trusted:
            raise ValueError(f"{run}/config.json names the reward function {spec}, which would import {file}, "
                             f"{where}: a run directory can name any code; read the file, then pass "
                             f"--trust-reward-code to import it")
        print(f"nesgpu {command}: importing the reward function {spec} from {file}", file=sys.stderr)


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
