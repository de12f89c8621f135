"""``python -m nesgpu``: the ``nesgpu`` command line."""

from .cli import main

raise SystemExit(main())
