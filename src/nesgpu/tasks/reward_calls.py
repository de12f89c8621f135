"""One call of a user's reward function, as a run can afford it: an ``async def`` function is awaited (TRL's
GRPOTrainer takes those too), an ``exit()`` / ``sys.exit()`` in it is an error naming it (SystemExit would end
the run silently, with status 0 mid-run), and a working directory it changes is restored after the call, with
one warning per function (the run's relative paths, its ``--out`` among them, must go on meaning the same)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import warnings
from collections.abc import Callable

from .generation_checks import RewardError, reward_error, reward_name


class RewardCalls:
    """Calls of a user's reward functions (call it as the function): holds which of them changed the working
    directory, for one warning each."""

    def __init__(self):
        self.moved: set[str] = set()

    def __call__(self, function: Callable, *args, **kwargs):
        """``function(*args, **kwargs)``, its coroutine awaited; its error (a SystemExit too: ``exit(0)`` must not
        end the run as if it had succeeded) is a RewardError naming it and the line it raised at, unless it is one
        already or the function ``names_its_errors`` itself (``Rewards``); the working directory is restored."""
        cwd = os.getcwd()
        try:
            value = function(*args, **kwargs)
            return _awaited(value) if inspect.isawaitable(value) else value
        except RewardError:
            raise
        except SystemExit as e:
            raise reward_error(function, e) from None
        except Exception as e:  # the user's function: its error, named as its own
            if getattr(function, "names_its_errors", False):
                raise
            raise reward_error(function, e) from e
        finally:
            self._restore(cwd, function)

    def _restore(self, cwd: str, function: Callable) -> None:
        try:
            now = os.getcwd()
        except OSError:  # the directory it moved to is gone
            now = None
        if now == cwd:
            return
        os.chdir(cwd)
        name = reward_name(function)
        if name not in self.moved:
            self.moved.add(name)
            warnings.warn(f"the reward function {name} changed the working directory (to {now}); nesgpu changes it "
                          f"back to {cwd} after each of its calls, so that the run's relative paths keep their "
                          f"meaning", stacklevel=3)


def _awaited(awaitable):
    """The value of ``awaitable``, awaited in an event loop of its own (in a thread where this one runs a loop,
    as in Jupyter)."""
    async def value():
        return await awaitable
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(value())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, value()).result()


__all__ = ["RewardCalls"]
