"""``python -m nesgpu``: the ``nesgpu`` command line."""

from .cli import main


def _run() -> None:
    try:
        status = main()
    finally:
        # Under ``python -m``, CPython ends the process with SIGINT (not our exit status) when any string
        # ``exec`` (a dataclass or namedtuple being built during an import) was cut by a KeyboardInterrupt,
        # even one main() caught and reported as exit 130. The flag is reset at the start of every string
        # ``exec``, so an empty one here lets our own exit status stand.
        exec("")
    raise SystemExit(status)


_run()
