"""``nesgpu train`` and ``nesgpu eval``: the command line over TrainConfig, one flag per field."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..layers import KINDS
from ..strategies import STRATEGIES
from ..strategies.schedules import KINDS as SCHEDULES
from .config import TrainConfig


def _hidden(text: str) -> tuple[int, ...]:
    """"64" or "64,64"; "0" or "" for none (a linear policy)."""
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer sizes like 64,64; got {text!r}") from None
    return tuple(s for s in sizes if s > 0)


def _chunk(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of directions or 'auto'; got {text!r}") from None


def add_train_parser(commands) -> None:
    p = commands.add_parser("train", help="train a model with ES (default: digits, low-rank MLP)",
                            description="Train with evolution strategies. Unset options take the task's "
                                        "defaults; a --config file sets options, and flags override it.")
    p.add_argument("--task", help="digits | mnist1d | reverse | sort | cartpole | pendulum | acrobot | mountaincar "
                                  "| gym:<id>")
    p.add_argument("--strategy", help=" | ".join(sorted(STRATEGIES)))
    p.add_argument("--layer", help="perturbation kind: " + " | ".join(sorted(KINDS)))
    p.add_argument("--model", help="architecture: mlp (the default); mnist1d also cnn (Conv1d); reverse, sort: "
                                   "transformer")
    p.add_argument("--population", type=int, help="members per step, both signs counted")
    p.add_argument("--sigma", type=float, help="noise scale")
    p.add_argument("--lr", type=float, help="learning rate (step size)")
    p.add_argument("--steps", type=int, help="ES steps")
    p.add_argument("--seed", type=int)
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--out", help="run directory (default: a new runs/<task>, runs/<task>-2, ...)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR up to --steps")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (else refused)")
    p.add_argument("--config", metavar="FILE.yaml", help="options from a YAML file")
    p.add_argument("--hidden", type=_hidden, help="hidden layer sizes, e.g. 64,64; 0 for a linear model; cnn: "
                   "channels per Conv1d; transformer: d_model[,n_layers[,n_heads[,dim_feedforward]]]")
    p.add_argument("--batch-size", type=int, dest="batch_size", help="supervised: samples per member per step")
    p.add_argument("--episodes", type=int, help="RL: episodes per member per step")
    p.add_argument("--eval-episodes", type=int, dest="eval_episodes")
    p.add_argument("--no-antithetic", dest="antithetic", action="store_const", const=False)
    p.add_argument("--shaping", help="centered_ranks | z_score | raw")
    p.add_argument("--weight-decay", type=float, dest="weight_decay")
    p.add_argument("--top-b", type=int, dest="top_b", help="ARS: directions used per step")
    p.add_argument("--ars-version", dest="ars_version", choices=["v1", "v2"])
    p.add_argument("--rank", type=int, help="low-rank layers: rank of each direction's noise")
    p.add_argument("--sigma-schedule", dest="sigma_schedule", choices=SCHEDULES)
    p.add_argument("--sigma-final", type=float, dest="sigma_final", help="sigma factor at the last step")
    p.add_argument("--lr-schedule", dest="lr_schedule", choices=SCHEDULES)
    p.add_argument("--lr-final", type=float, dest="lr_final", help="lr factor at the last step")
    p.add_argument("--chunk-size", type=_chunk, dest="chunk_size", metavar="N|auto",
                   help="evaluate the population in blocks of N directions (auto: the largest that fits)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="population forward under autocast")
    p.add_argument("--dist-timeout", type=float, dest="dist_timeout",
                   help="seconds before a collective with a dead or hung process fails (torchrun)")
    p.add_argument("--eval-every", type=int, dest="eval_every")
    p.add_argument("--progress-every", type=float, dest="progress_every",
                   help="seconds between progress lines when stderr is not a terminal (default 30; 0: none)")
    p.add_argument("--target", type=float, help="stop once the evaluated metric reaches this value (gym tasks: "
                   "the environment's reward_threshold by default)")
    p.add_argument("--checkpoint-every", type=int, dest="checkpoint_every")
    p.set_defaults(func=run_train)


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
        values.update(json.loads(path.read_text()))
        values["out"] = args.resume
    if args.config:
        values.update({k: v for k, v in vars(TrainConfig.from_yaml(args.config)).items()
                       if v != getattr(TrainConfig(), k)})
    fields = {f for f in TrainConfig.__dataclass_fields__}
    for key, value in vars(args).items():
        if key in fields and value is not None:
            values[key] = value
    if args.rank is not None:
        values["layer_options"] = {**values.get("layer_options", {}), "rank": args.rank}
    return TrainConfig.from_dict(values), bool(args.resume)


def run_train(args: argparse.Namespace) -> int:
    from .trainer import train

    cfg, resume = config_from_args(args)
    summary = train(cfg, resume=resume, overwrite=args.overwrite)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, rank 0 speaks for the job
        print(json.dumps(summary))
    return 0


def add_eval_parser(commands) -> None:
    p = commands.add_parser("eval", help="evaluate a finished run's model", description="Evaluate DIR/model.safetensors "
                            "on its task (test accuracy or mean return) and print JSON.")
    p.add_argument("run", metavar="DIR")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from .trainer import evaluate_run

    print(json.dumps(evaluate_run(args.run, args.device)))
    return 0


__all__ = ["add_eval_parser", "add_train_parser", "config_from_args"]
