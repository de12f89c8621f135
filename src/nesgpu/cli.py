"""The ``nesgpu`` command line.

    nesgpu train [options]            train with ES (no options: digits, low-rank MLP)
    nesgpu eval DIR                   evaluate a finished run
    nesgpu play DIR [--video F.mp4]   run a trained RL policy for a few episodes, optionally filmed
    nesgpu tune --trials N --out DIR  Bayesian search (Optuna) over train options; takes every train option
    nesgpu compare [--time-budget S]  ES and backprop side by side under one wall-clock budget
    nesgpu check --model hf:DIR       prove that every population row equals its member's own model

Each command module provides ``add_parser(subparsers)``, which registers its subcommand and sets
``func`` (called with the parsed arguments, returns the exit status). To add a command (e.g. ``train``),
register it in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import warnings
from collections.abc import Callable

from .version import __version__


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``argv`` (default: the command line): ``train`` and ``tune`` get the flags of the task,
    strategy and layer it names."""
    from .exactness import cli as check_cli
    from .frontends.compare import add_compare_parser
    from .frontends.play import add_play_parser
    from .frontends.train_cli import add_eval_parser, add_train_parser
    from .frontends.train_flags import chosen, foreign_flag
    from .tune import cli as tune_cli

    parser = ExactFlags(prog="nesgpu", description="Evolution strategies for PyTorch.")
    parser.add_argument("--version", action="version", version=f"nesgpu {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    argv = sys.argv[1:] if argv is None else argv
    named = argv[1:] if argv[:1] in (["train"], ["tune"]) else []
    if named:  # another component's option is not a flag of train or tune: say whose it is
        parser.foreign = lambda flag, value: foreign_flag(flag, value, chosen(named))
    add_train_parser(commands, named)
    add_eval_parser(commands)
    add_play_parser(commands)
    tune_cli.add_parser(commands, named)
    add_compare_parser(commands)
    check_cli.add_parser(commands)

    return parser


class ExactFlags(argparse.ArgumentParser):
    """A parser that takes only whole flag names: argparse would read ``--reward`` (any unique prefix) as
    ``--reward-shift``, so a mistyped or future flag would set another option. Every subcommand's parser is
    of this class too (``add_subparsers`` makes its parsers of the parent's class). ``foreign(flag, value)``,
    where set, says why an unknown flag is refused (another component's option), or None."""

    foreign: Callable[[str, str | None], str | None] | None = None

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """A mistake on the command line, in one line (no usage: ``--help`` shows it). argparse reads a value
        that starts with '-' (``--linear-sizes -8x8``) as a flag and says only "expected one argument"; say
        how to pass such a value."""
        unknown = message.removeprefix("unrecognized arguments: ").split()
        if message.startswith("unrecognized arguments: ") and self.foreign is not None:
            value = unknown[1] if len(unknown) > 1 and not unknown[1].startswith("--") else None
            value = unknown[0].split("=", 1)[1] if "=" in unknown[0] else value
            message = self.foreign(unknown[0], value) or message
        if message.endswith(("expected one argument", "expected at least one argument")):
            flag = message.removeprefix("argument ").split(":")[0].split("/")[-1]
            message += (f" (a value that starts with '-' is read as a flag: write it as {flag}=VALUE, "
                        f"e.g. {flag}=-1)")
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning from the command line is one line, like an error (no source file and line), labelled by who
    raised it: nesgpu, MuJoCo's C library, or the installed package whose code it came from (gymnasium, ...)."""
    print(f"{warning_source(filename)}: warning: {message}", file=file or sys.stderr)


def warning_source(filename: str) -> str:
    """Who raised a warning from ``filename``: "mujoco" (MuJoCo's messages, see nesgpu.tasks.gym), an
    installed package's name, or "nesgpu"."""
    if filename == "mujoco":
        return "mujoco"
    parts = str(filename).replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts[:-1]:
            package = parts[parts.index(marker) + 1].removesuffix(".py")
            return package if package and package != "nesgpu" else "nesgpu"
    return "nesgpu"


def _asked(e: BaseException) -> str:
    """How much the failed allocation asked for, as the allocator said it."""
    text = str(e)
    found = re.search(r"allocate (\d+) bytes", text)  # the CPU allocator's words
    if found:
        return f"tried to allocate {int(found.group(1)) / 2**30:.1f} GiB"
    found = re.search(r"[Tt]ried to allocate [\d.]+ \w+", text)  # CUDA's
    return found.group(0) if found else text.splitlines()[0][:120] if text else type(e).__name__


def _build_parser_answering_ctrl_c(argv: list[str] | None) -> argparse.ArgumentParser | None:
    """The parser (it imports torch and the commands: seconds), or None after a Ctrl-C in that time. The
    Ctrl-C is held until the imports end: a KeyboardInterrupt inside numpy's import comes out as another
    error (an ImportError, an AttributeError), which would be a traceback."""
    interrupted = []
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    except ValueError:  # not the main thread: no handler can be set, Ctrl-C is the caller's
        return build_parser(argv)
    try:
        parser = build_parser(argv)
    except BaseException:
        if interrupted:
            return None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    return None if interrupted else parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nesgpu`` console script and ``python -m nesgpu``."""
    # torch runs without numpy (nesgpu's core needs only torch) but warns at import that it could not load it
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:  # at once: without torch and the commands
        print(f"nesgpu {__version__}")
        return 0
    parser = _build_parser_answering_ctrl_c(argv)
    if parser is None:
        print("nesgpu: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    with warnings.catch_warnings(), _noting_ctrl_c() as pressed:
        warnings.showwarning = show_warning
        try:
            return args.func(args)
        except BaseException as e:
            if pressed and not isinstance(e, SystemExit):  # a Ctrl-C inside an import (numpy's, sklearn's) can
                parser.exit(130, f"nesgpu {args.command}: interrupted\n")  # come out as any other error
            _exit_with_one_line(parser, args.command, e)


@contextlib.contextmanager
def _noting_ctrl_c():
    """Ctrl-C raises KeyboardInterrupt as before, and is noted in the list this yields (see main)."""
    pressed = []

    def note(signum, frame):
        pressed.append(True)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, note)
    except ValueError:  # not the main thread: Ctrl-C is the caller's
        yield pressed
        return
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_with_one_line(parser: argparse.ArgumentParser, command: str, e: BaseException) -> None:
    """A user's mistake, a full disk, an allocation too large or a Ctrl-C as one line and its exit status;
    anything else is a bug, raised as it is."""
    if isinstance(e, (ValueError, TypeError, ImportError)):  # bad input: one clear line, not a traceback
        parser.exit(2, f"nesgpu {command}: error: {e}\n")
    if isinstance(e, OSError):  # a full disk, a read-only path: the file, and why (checkpoints are atomic)
        where = f" ({e.filename})" if e.filename else ""
        parser.exit(1, f"nesgpu {command}: error: {e.strerror or e}{where}; checkpoints are written "
                       f"atomically, so the last one written (if any) is intact\n")
    if isinstance(e, (RuntimeError, MemoryError)):  # an allocation larger than the machine: what to lower
        from .memory import out_of_memory  # (here: --version runs without torch)
        if out_of_memory(e):
            parser.exit(1, f"nesgpu {command}: error: out of memory ({_asked(e)}); lower the sizes that set it "
                           f"(--batch-size, --hidden, --population, --chunk-size, --episodes)\n")
    if isinstance(e, KeyboardInterrupt):  # a second Ctrl-C, or one outside the training loop
        parser.exit(130, f"nesgpu {command}: interrupted\n")
    from .train.trainer import Interrupted
    if isinstance(e, Interrupted):  # the first Ctrl-C: stopped at a step with a checkpoint
        parser.exit(130, f"nesgpu {command}: {e}\n")
    raise e

if __name__ == "__main__":
    raise SystemExit(main())
