"""Warnings from gymnasium environments, shown once: an :class:`EnvWarnings` is owned by the environments of
one task (its spec's, its vector envs'), and remembers what it showed.

Environments can warn at every reset or step, in every row: gymnasium's environment checker on each row's
first reset and step, MuJoCo's C library (``mju_warning``: at each model compile, e.g. HalfCheetah-v5's
"compiler attribute 'settotalmass' is deprecated", and at instabilities, "Nan, Inf or huge value in QACC ..."),
or the environment's own code. Inside the calls into the environment only (creation, reset, step), a warning
whose category and text its :class:`EnvWarnings` has shown is not shown again, even under an "always" filter;
everything else about the user's filters holds ("error" raises, "ignore" drops). MuJoCo's messages arrive as
:class:`MujocoWarning` (module "mujoco", so ``-W "ignore:::mujoco"`` silences them) instead of being printed
and appended to ``MUJOCO_LOG.TXT`` in the working directory, unless the process has a
``mujoco.set_mju_user_warning`` handler of its own. Under async workers the rows' warnings are raised in the
worker processes; :class:`Recorder` records them there, they travel in the step's info, and
:meth:`EnvWarnings.show_forwarded` shows them here by the same rules, under the filters in force at the reset
or step that brings them.
"""

from __future__ import annotations

import pickle
import re
import sys
import warnings

WARNINGS_KEY = "nesgpu_warnings"  # info key that carries a worker's warnings to the main process
_MUJOCO_TIME = re.compile(r"\s*Time = [-+0-9.eE]+\.?\s*$")  # MuJoCo's instability messages end with the time


class MujocoWarning(UserWarning):
    """A message of MuJoCo's C library (``mju_warning``), raised as a Python warning from module "mujoco"."""


def dedup_key(category: type, text: str) -> tuple[type, str]:
    """What makes two warnings the same: category and text (a MuJoCo message without its time stamp)."""
    if issubclass(category, MujocoWarning):
        text = _MUJOCO_TIME.sub("", text)
    return category, text


class EnvWarnings:
    """What the environments of one task have shown, and the registries their forwarded warnings go through."""

    def __init__(self):
        self.shown: set[tuple[type, str]] = set()
        self.mujoco_registry: dict = {}  # warnings.warn_explicit's "once"/"default" bookkeeping
        self.forwarded_registry: dict = {}

    def call(self, mujoco: bool = True) -> ShowOnce:
        """The context of one call into an environment in this process (see the module docstring)."""
        return ShowOnce(self, mujoco)

    def warn_mujoco(self, text: str) -> None:
        warnings.warn_explicit(text, MujocoWarning, "mujoco", 0, module="mujoco", registry=self.mujoco_registry)

    def show_forwarded(self, info: dict) -> None:
        """Raise, in this process, the warnings async workers recorded (call it inside :meth:`call`)."""
        caught, mask = info.get(WARNINGS_KEY), info.get("_" + WARNINGS_KEY)
        if caught is None:
            return
        for row, records in enumerate(caught):
            if mask is not None and not mask[row]:
                continue
            for category, text, filename, lineno, module in records or ():
                registry = self.mujoco_registry if category is MujocoWarning else self.forwarded_registry
                warnings.warn_explicit(text, category, filename, lineno, module=module, registry=registry)


class ShowOnce:
    """A call into an environment: a warning shown inside it is shown only if its :class:`EnvWarnings` has not
    shown it; MuJoCo's messages become :class:`MujocoWarning`. Filters are left alone (``warnings.catch_warnings``
    would reset every module's "default" registry at each step), only ``warnings.showwarning`` is swapped for the
    call. Nests."""

    def __init__(self, owner: EnvWarnings, mujoco: bool = True):
        self.owner, self.hook_mujoco = owner, mujoco

    def __enter__(self):
        self.previous = warnings.showwarning
        if not isinstance(self.previous, _OnceShower):
            warnings.showwarning = _OnceShower(self.previous, self.owner.shown)
        self.mujoco = sys.modules.get("mujoco") if self.hook_mujoco else None
        self.messages = catch_mujoco_messages(self.mujoco)  # a handler set before (the process's) stays
        return self

    def __exit__(self, *exc):
        try:
            if self.messages is not None:
                self.mujoco.set_mju_user_warning(None)
                for text in self.messages:
                    self.owner.warn_mujoco(text)
        finally:
            warnings.showwarning = self.previous
        return False


class _OnceShower:
    """``warnings.showwarning`` inside :class:`ShowOnce`: passes on what was not shown before."""

    __slots__ = ("shown", "show")

    def __init__(self, show, shown: set):
        self.show, self.shown = show, shown

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        key = dedup_key(category, str(message))
        if key in self.shown:
            return
        self.shown.add(key)
        self.show(message, category, filename, lineno, file, line)


def catch_mujoco_messages(mujoco) -> list[str] | None:
    """Route MuJoCo's C-level warning messages into a new list (returned) while no other handler is set;
    None (nothing routed) when mujoco is not loaded or a handler is already in place."""
    get = getattr(mujoco, "get_mju_user_warning", None)
    if get is None or get() is not None:
        return None
    messages: list[str] = []
    mujoco.set_mju_user_warning(messages.append)
    return messages


class Recorder:
    """Context for a call into the environment in an async worker: records every warning (filters are the main
    process's business) and every MuJoCo message, to travel to the main process in the call's info.
    ``modules`` (filename -> module name, what warning filters match) is the worker's own lookup table."""

    def __init__(self, modules: dict[str, str | None]):
        self.caught: list[tuple] = []
        self.modules = modules

    def __enter__(self):
        self._catch = warnings.catch_warnings(record=True)
        self._log = self._catch.__enter__()
        warnings.simplefilter("always")
        self._mujoco = sys.modules.get("mujoco")
        self._messages = catch_mujoco_messages(self._mujoco)  # the worker's own (fork copies none)
        return self

    def __exit__(self, *exc):
        try:
            if self._messages is not None:
                self._mujoco.set_mju_user_warning(None)
                self.caught += [(MujocoWarning, text, "mujoco", 0, "mujoco") for text in self._messages]
        finally:
            self._catch.__exit__(*exc)
        for w in self._log:
            category = w.category
            try:
                pickle.dumps(category)
            except Exception:  # a class the main process may not be able to load
                category = UserWarning
            self.caught.append((category, str(w.message), w.filename, w.lineno, self.module_of(w.filename)))
        return False

    def module_of(self, filename: str) -> str | None:
        """The name of the imported module in ``filename``, or None."""
        if filename not in self.modules:
            self.modules[filename] = next((name for name, module in list(sys.modules.items())
                                           if getattr(module, "__file__", None) == filename), None)
        return self.modules[filename]


__all__ = ["WARNINGS_KEY", "EnvWarnings", "MujocoWarning", "Recorder", "ShowOnce", "catch_mujoco_messages",
           "dedup_key"]
