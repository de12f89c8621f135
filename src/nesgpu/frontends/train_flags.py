"""The flags of ``nesgpu train`` (and ``tune``) for the components in hand: the command line is read for
``--task``, ``--strategy``, ``--layer`` and ``--model`` first (or a ``--config`` file's, or a resumed run's),
then the parser gets the run's options that apply to them, with their defaults, and exactly those
components' own options. Another component's option is not a flag here: :func:`foreign_flag` names whose it
is."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import NamedTuple

from ..layers import KINDS
from ..options import annotation_text
from ..tasks import TASKS, task_key
from ..train.setup.ars_paper import preset_values
from ..train.setup.config import TrainConfig, presets
from ..train.setup.defaults import preset_parts
from ..strategies import STRATEGIES
from ..train.setup.defaults import BACKPROP, ES_ONLY, compiling_tasks, needs_gaussian
from ..train.setup.component_options import KEYS, STRATEGY, TASK
from ..train.setup.validation import act_bits_apply, bits_apply
from ..files import read_json


class Formatter(argparse.HelpFormatter):
    """Help with room for a flag and its value before the text."""

    def __init__(self, prog: str, **kwargs):
        super().__init__(prog, max_help_position=26, **kwargs)


class Chosen(NamedTuple):
    """The components a command line names: its task, strategy (None: the task's own), layer and model."""

    task: str = "digits"
    strategy: str | None = None
    layer: str = "lowrank"  # the strategy's default where it needs another (see ``chosen``)
    model: str | None = None


def chosen(argv: list[str]) -> Chosen:
    """The components ``argv`` (a train command's arguments) names: its flags, else its ``--config`` file's,
    else its ``--resume`` run's, else the defaults. A file that cannot be read leaves the defaults (the run
    itself names the error)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("task", "strategy", "layer", "model", "preset", "config", "resume"):
        p.add_argument(f"--{name}")
    args, _ = p.parse_known_args(argv)
    found: dict = {}
    for file, read in ((args.resume and Path(args.resume) / "config.json", read_json),
                       (args.config, TrainConfig.read_yaml)):
        try:
            values = read(file) if file else {}
        except (OSError, ValueError, TypeError):
            values = {}
        found.update({k: v for k, v in values.items() if isinstance(v, str)} if isinstance(values, dict) else {})
    found.update({k: v for k, v in vars(args).items() if v is not None})
    if found.get("preset"):  # what the preset sets, where the command line and files do not
        found = {**preset_components(found["preset"], found.get("task", "digits")), **found}
    if "layer" not in found and needs_gaussian(STRATEGIES.get(found.get("strategy")), "lowrank"):
        found["layer"] = "gaussian"  # the default layer follows the strategy (CMA-ES: IID Gaussian noise)
    return Chosen(**{k: found[k] for k in Chosen._fields if k in found})


def preset_components(preset: str, task: str) -> dict:
    """The strategy and layer ``preset`` sets for ``task`` (none, for a preset or task it does not know: the
    run names that error)."""
    try:
        values = preset_values(preset, task)
    except ValueError:
        return {}
    return {k: values[k] for k in ("strategy", "layer") if k in values}


def shown(name: str, c: Chosen) -> bool:
    """Whether the run option ``name`` applies to the chosen components (else its flag is left out of
    ``--help``; set, it is still checked, and refused where it does not apply)."""
    spec = TASKS.get(task_key(c.task) or "")
    model = c.model or (spec.models[0] if spec else "mlp")
    if c.strategy == BACKPROP and name in ES_ONLY:
        return False
    if name in ("bits", "noise_on"):
        return bits_apply(c.task, model)
    if name == "act_bits":
        return bits_apply(c.task, model) and act_bits_apply(model)
    if name == "preset":
        return c.task.startswith("gym:")
    if name == "compile":
        return c.task in compiling_tasks()
    if name == "hidden":
        return spec is None or spec.model_prefix is None
    return True


def hidden_sizes(text: str) -> tuple[int, ...]:
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


def _count(text: str) -> int | float:
    """A count (an int) or a fraction (a float)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a count (int) or a fraction (float); got {text!r}") from None


def scalar_type(annotation: str):
    for name, parse in (("int | float", _count), ("int", int), ("float", float), ("str", str)):
        if annotation.startswith(name):
            return parse
    raise TypeError(f"no command-line parser for annotation {annotation!r}")  # a new field type: add it here


PARSERS = {"chunk": _or_auto(int, "a number of directions"), "auto": _or_auto(float, "a number")}
METAVARS = {int: "N", float: "X", _count: "N|X", hidden_sizes: "N,N"}


def _shown_default(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "0"
    return "none" if value is None else str(value)


def _add(p, name: str, f: dataclasses.Field, default, help: str | None = None, dest: str | None = None) -> None:
    """The flag ``--name`` of field ``f`` (a run option's or a component's), its default in the help."""
    meta, text = f.metadata, annotation_text(f.type)
    doc = meta.get("help", "")
    if help is None:
        help = doc + (f" (default: {default})" if default not in ("", "none") and "default" not in doc else "")
    kwargs: dict = dict(dest=dest or name, default=None, help=help)
    flag = "--" + name.replace("_", "-")
    if text.split(" | ")[0] == "bool":
        p.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        return
    kwargs["type"] = PARSERS.get(meta.get("parse")) or (hidden_sizes if text.startswith("tuple[int")
                                                                 else scalar_type(text))
    choices = meta.get("choices")
    if choices:
        kwargs["choices"] = choices() if callable(choices) else choices
    if "choices" not in kwargs:
        kwargs["metavar"] = meta.get("metavar") or METAVARS.get(kwargs["type"], "TEXT")
    p.add_argument(flag, **kwargs)


def _run_default(f: dataclasses.Field, defaults: dict) -> str:
    if f.metadata.get("per_task"):
        return _shown_default(defaults[f.name]) if f.name in defaults else "the task's"
    if f.default_factory is not dataclasses.MISSING:
        return ""
    return _shown_default(f.default)


def _model_help(task: str, default: str) -> str:
    """The model flag's help for ``task``: its architectures, or the location its model is loaded from."""
    spec = TASKS.get(task_key(task))
    if spec is None:  # a task of the user's own (a resumed run's "custom:<name>"): its model is the user's too
        return "the model of a task of your own comes with the task"
    if spec.model_prefix is not None:
        return f"{spec.models[0]}: a local Hugging Face model directory"
    return f"architecture: {' | '.join(spec.models)} (default: {default})"


def _component_fields(owners, owner) -> list[dataclasses.Field]:
    options = owners.registry.get(owner)
    return list(dataclasses.fields(options)) if options is not None else []


def add_config_arguments(p: argparse.ArgumentParser, c: Chosen) -> None:
    """The flags of the chosen components (``--batch-size`` for ``batch_size``): the run's options that
    apply to them, the chosen strategy's and task's options, and the chosen layer kind's, each typed from its
    annotation, with its doc and default in ``--help``. Unset flags stay None, so a config file or a resumed
    run's options are not overridden by defaults."""
    try:
        defaults, *sides = preset_parts(c.task, c.model, c.strategy)
    except ValueError:  # an unknown task, model or strategy: named when the config is resolved
        defaults, sides = {}, [{}, {}]
    strategy = c.strategy or defaults.get("strategy")
    for f in dataclasses.fields(TrainConfig):
        if f.name != "layer_options" and not f.metadata.get("component"):
            help = None if shown(f.name, c) else argparse.SUPPRESS
            if f.name == "model" and defaults:
                help = _model_help(c.task, defaults["model"])
            _add(p, f.name, f, _run_default(f, defaults), help)
    owned = ((STRATEGY, strategy, f"strategy {strategy}"), (TASK, task_key(c.task), f"task {c.task}"))
    both = set.intersection(*({f.name for f in _component_fields(owners, owner)} for owners, owner, _ in owned))
    for (owners, owner, title), shown_defaults in zip(owned, sides):
        fields = _component_fields(owners, owner)
        group = p.add_argument_group(f"{title} options") if fields else None
        for f in fields:
            default = _shown_default(shown_defaults.get(f.name, f.default))
            if f.name in both:  # a name both take: --strategy-NAME, --task-NAME
                _add(group, f"{owners.kind}_{f.name}", f, default, dest=f"{KEYS[owners.kind]}:{f.name}")
            else:
                _add(group, f.name, f, default)
    if shown("layer_options", c):
        _add_layer_flags(p, c.layer)


def foreign_flag(flag: str, value, c: Chosen) -> str | None:
    """Why ``flag`` (``--top-b``, given ``value``), not a flag of the components ``c`` names, is refused: it is
    an option of another strategy, task or layer kind (None: of none)."""
    flag = flag.split("=", 1)[0]
    name = flag.removeprefix("--").replace("-", "_")
    for parse in (int, float):  # the value as the option's own flag would have read it
        try:
            value = parse(value)
            break
        except (TypeError, ValueError):
            pass
    layers = layer_option_flags()
    if flag in layers:
        kind = layers[flag][0]
        if c.strategy == BACKPROP:
            return (f"option {flag} (= {value!r}) applies to layer {kind!r}, an ES option; strategy 'backprop' "
                    f"perturbs no layer; drop it or choose an ES strategy")
        return (f"option {flag} (= {value!r}) applies to layer {kind!r}, not to layer {c.layer!r}; drop it or "
                f"choose --layer {kind}")
    try:
        strategy = c.strategy or presets(c.task, c.model, None)["strategy"]
    except ValueError:  # an unknown task or model: the run names that error
        return None
    hint = "" if c.strategy else " (the task's default)"
    if name in STRATEGY.defaults_of(strategy) and name in TASK.defaults_of(task_key(c.task)):
        bare = flag.removeprefix("--")
        return (f"option {flag} is an option of strategy {strategy!r}{hint} and of task {c.task!r}: give "
                f"--strategy-{bare} or --task-{bare}")
    for owners, owner, why in ((STRATEGY, strategy, hint), (TASK, task_key(c.task), "")):
        for option, negated in ((name, False), (name.removeprefix("no_"), True)):
            field = owners.field(option) if owners.owners(option) else None
            is_bool = field is not None and annotation_text(field.type).startswith("bool")
            if field is None or (negated and not is_bool):  # --no-NAME: a bool option's
                continue
            return str(owners.refusal(option, (not negated) if is_bool else value, owner, why))
    return None


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


def _add_layer_flags(p, layer: str) -> None:
    """A flag per option of the chosen layer kind (they fill layer_options, which the kind checks)."""
    group = p.add_argument_group(f"layer {layer} options")
    for flag, (kind, f) in layer_option_flags().items():
        if kind != layer:
            continue
        doc = f.metadata.get("help", "")
        kwargs = dict(dest=f"layer_option:{f.name}", default=None, type=scalar_type(f.type),
                      help=doc + ("" if "default" in doc else f" (default: {f.default})"))
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        else:
            kwargs["metavar"] = METAVARS.get(kwargs["type"], "TEXT")
        group.add_argument(flag, **kwargs)
