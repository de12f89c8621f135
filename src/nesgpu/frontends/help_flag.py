"""``-h/--help`` of a command whose options depend on its ``--task`` (``nesgpu train``): for an unknown task
there are no options to list, so ``--help`` says that the task is unknown, in one line, and exits 2."""

from __future__ import annotations

import argparse


def unknown_task(argv: list[str]) -> str | None:
    """Why the ``--task`` that ``argv`` gives is refused (None: none is given, or it is a known task)."""
    from ..tasks import task_spec

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--task")
    task = p.parse_known_args(argv)[0].task
    if task is None:
        return None
    try:
        task_spec(task)
    except ValueError as e:
        return str(e)
    return None


class _Refused(argparse.Action):
    """A ``--help`` that exits 2 with ``message`` as the command's one error line."""

    def __init__(self, option_strings, dest, message: str, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(2, f"{parser.prog}: error: {self.message}\n")


def add_help_flag(p: argparse.ArgumentParser, argv: list[str]) -> None:
    """``-h/--help`` for ``p`` (made with ``add_help=False``): argparse's own, or for an unknown ``--task`` in
    ``argv`` one that names the error."""
    why = unknown_task(argv)
    if why is None:
        p.add_argument("-h", "--help", action="help", help="show this help message and exit")
    else:
        p.add_argument("-h", "--help", action=_Refused, message=why, help="show this help message and exit")


__all__ = ["add_help_flag", "unknown_task"]
