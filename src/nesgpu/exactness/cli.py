"""``nesgpu check``: :func:`nesgpu.check` on a local Hugging Face directory or on a Python file's model.

    nesgpu check --model hf:DIR [--prompt TEXT ...] [--new-tokens 4] [--compile]
    nesgpu check --model my_model.py:build          # build() returns (model, example_inputs)

Exit status: 0 when every population row equals its member's own model, 1 when any differs or the model is
refused (the report says where and why), 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import importlib.util
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
    p.add_argument("--tolerance", type=float, default=1e-9, help="largest relative difference counted as exact")
    p.add_argument("--compile", action="store_true", help="the population's generate() runs the compiled "
                   "static-cache decode (torch.compile), checked against every member's own eager generate()")
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from .check import check

    if args.new_tokens < 0:  # checked before the model loads
        raise ValueError(f"--new-tokens must be >= 0; got {args.new_tokens}")
    if args.directions < 1:
        raise ValueError(f"--directions must be >= 1; got {args.directions}")
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

    from ..tasks.reward_tasks import hf_directory, load_causal_lm, load_tokenizer

    directory = hf_directory(spec)
    model = load_causal_lm(directory)
    try:
        tokenizer = load_tokenizer(directory)
        tokenizer.padding_side = "left"
        encoded = tokenizer(prompts, padding=True, return_tensors="pt")
        if encoded["input_ids"].shape[-1] > 0:
            return model, {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    except (ValueError, TypeError):  # no usable tokenizer: random ids in the vocabulary, below
        pass
    ids = torch.randint(3, model.config.vocab_size, (len(prompts), 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
