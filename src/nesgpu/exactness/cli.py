"""``nesgpu check``: :func:`nesgpu.check` on a local Hugging Face directory or on a Python file's model.

    nesgpu check --model hf:DIR [--prompt TEXT ...] [--new-tokens 4] [--compile]
    nesgpu check --model my_model.py:build          # build() returns (model, example_inputs)

Exit status: 0 when every population row equals its member's own model, 1 when any differs or the model is
refused (the report says where and why), 2 for a bad argument or a directory training refuses (a tokenizer
larger than the model's embedding).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path

from ..kinds import KINDS

PROMPTS = ("The quick brown fox jumps over", "1 + 2 =")


def add_parser(commands) -> None:
    p = commands.add_parser("check", help="prove that the population is exact on your model",
                            description="Prove, in float64, that every population row of a model equals its "
                            "member's own model, module by module; exit 1 on any difference.", allow_abbrev=False)
    p.add_argument("--model", required=True, help="hf:DIR (a local Hugging Face directory) or FILE.py:NAME, a "
                   "function returning (model, example_inputs)")
    p.add_argument("--prompt", action="append", default=None, help=f"an example prompt for hf:DIR (repeatable; "
                   f"default: {list(PROMPTS)})")
    p.add_argument("--directions", type=int, default=4, help="directions (2x as many members are checked)")
    p.add_argument("--kind", default="lowrank", choices=sorted(KINDS),
                   help="perturbation kind of the matrices (as nesgpu train --layer)")
    p.add_argument("--new-tokens", type=int, default=4, help="generate() tokens to compare, greedy and sampled (0: forward only)")
    p.add_argument("--fallback", action="append", default=[], metavar="MODULE",
                   help="a module to run through the exact fallback (repeatable), as convert(fallback=[...])")
    p.add_argument("--tolerance", type=float, default=1e-9, help="largest relative difference counted as exact (a "
                   "finite number >= 0)")
    p.add_argument("--compile", action="store_true", help="the population's generate() runs the compiled "
                   "static-cache decode (torch.compile), checked against every member's own eager generate()")
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from .check import check

    if args.new_tokens < 0:  # checked before the model loads
        raise ValueError(f"--new-tokens must be >= 0; got {args.new_tokens}")
    if args.directions < 1:
        raise ValueError(f"--directions must be >= 1; got {args.directions}")
    if not math.isfinite(args.tolerance) or args.tolerance < 0:  # NaN would call every model DIFFERENT
        raise ValueError(f"--tolerance must be a finite number >= 0; got {args.tolerance}")
    if args.compile and not args.new_tokens:
        raise ValueError("--compile compiles generate()'s decode; it needs --new-tokens >= 1")
    model, inputs = load_model(args.model, args.prompt)
    report = check(model, inputs, directions=args.directions, kind=args.kind, tolerance=args.tolerance,
                   max_new_tokens=args.new_tokens if hasattr(model, "generate") else 0, fallback=args.fallback,
                   compile=args.compile)
    print(report)
    return 0 if report.exact else 1


def load_model(spec: str, prompts: list[str] | None):
    """(model, example inputs) of ``hf:DIR`` or ``FILE.py:NAME``."""
    if spec.startswith("hf:"):
        return _hf_model(spec, prompts or list(PROMPTS))
    path, _, name = spec.rpartition(":")
    if not path.endswith(".py") or not name:
        raise ValueError(f"--model must be hf:DIR or FILE.py:NAME; got {spec!r}")
    if prompts:
        raise ValueError("--prompt applies to --model hf:DIR; a Python file's function gives its own inputs")
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"--model {spec}: {file} is not a file")
    module_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)  # the user's own file, run as `python FILE` would
    build = getattr(module, name, None)
    if not callable(build):
        raise ValueError(f"--model {spec}: {file} has no function {name!r}")
    built = build()
    if not (isinstance(built, tuple) and len(built) == 2):
        raise ValueError(f"--model {spec}: expected {name}() to return (model, example_inputs); got "
                         f"{type(built).__name__}")
    return built


def _hf_model(spec: str, prompts: list[str]):
    import torch

    from ..tasks.reward_tasks import hf_directory, load_causal_lm

    directory = hf_directory(spec)
    model = load_causal_lm(directory)
    encoded = _prompt_ids(directory, model, prompts)
    if encoded is not None:
        return model, encoded
    ids = torch.randint(3, model.config.vocab_size, (len(prompts), 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _prompt_ids(directory: Path, model, prompts: list[str]) -> dict | None:
    """The prompts in the directory's tokenizer, padded on the left (None: it has no usable tokenizer, and
    random ids in the vocabulary stand in). A tokenizer with more tokens than the model's embedding has rows
    is refused, in training's words: training refuses that directory too."""
    from ..tasks.reward_tasks import check_vocabulary, load_tokenizer

    try:
        tokenizer = load_tokenizer(directory)
    except (ValueError, TypeError):
        return None
    check_vocabulary(tokenizer, model, directory)  # not swallowed: the directory is refused
    try:
        tokenizer.padding_side = "left"
        encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    except (ValueError, TypeError):
        return None
    if encoded["input_ids"].shape[-1] == 0:
        return None
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
