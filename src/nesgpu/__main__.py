"""``python -m nesgpu``: the ``nesgpu`` command line."""

import os
import sys

# ``python -m`` puts the working directory first on the import path: inside a run directory someone sent you,
# its ``gymnasium.py`` or ``tabulate.py`` would be imported in place of the installed module. Take it off, so
# that ``python -m nesgpu`` imports what the ``nesgpu`` script does (a user's own modules, named by --reward or
# gym:module:Env-v0, are still found there: see nesgpu.tasks.user_code).
if sys.path and not getattr(sys.flags, "safe_path", False) and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import main  # noqa: E402


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
