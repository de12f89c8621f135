"""Run directories: who may write into one, and what a resumed run may change.

- A new run refuses an existing run directory unless told to ``overwrite`` it; a directory that holds
  anything but a run is never cleared.
- A lock file (``DIR/.lock``, holding the writer's pid) stops a second process from writing into a live
  run; the lock of a process that no longer exists is taken over.
- Temporary files and directories left by a killed write are removed when the next run starts.
- ``overwrite`` deletes the old run only once the new run has made its first step (:class:`Replacement`).
- On resume, the options that define the run must match the checkpoint's; the others may change.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import warnings
from pathlib import Path

from ..setup.component_options import defining_options, keyed
from ...files import read_json, read_text

# the run options that define a run: changing them would make the checkpoint another run's (a strategy's or a
# task's own options say so themselves: ``option(..., defines=True)``; see :func:`defining`)
DEFINING = ("task", "model", "layer", "layer_options", "hidden", "population", "antithetic", "seed", "strategy",
            "bits", "noise_on", "act_bits", "dtype", "init", "evolve", "update")



def defining() -> list[str]:
    """Every option that defines a run: the run's own (DEFINING) and the components' declared so."""
    return [*DEFINING, *defining_options()]


# files a run writes (what --overwrite removes)
RUN_FILES = ("config.json", "summary.json", "metrics.csv", "model.safetensors", "curve.png", "trackers.json",
             "samples.jsonl")
RUN_DIRS = ("checkpoint", "checkpoint.prev", "tensorboard", "wandb", "mlruns", "hf")
LOCK = ".lock"
REPLACED = ".replaced"  # DIR/.replaced-PID: an old run moved aside by --overwrite (Replacement)


def is_run_directory(path: Path) -> bool:
    """Whether ``path`` holds a nesgpu run: a config.json that nesgpu wrote (a mapping with its fields)."""
    try:
        config = read_json(path / "config.json")
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and {"task", "layer", "population", "sigma", "strategy"} <= set(config)


def fresh_directory(root: Path, name: str) -> Path:
    """``root/name``, or ``root/name-2``, ``-3``, ... : the first that does not exist yet (the default --out)."""
    candidate, n = root / name, 1
    while candidate.exists():
        n += 1
        candidate = root / f"{name}-{n}"
    return candidate


def check(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse what a run may not do with ``out`` (which the caller holds the lock of). Deletes nothing."""
    if resume and overwrite:
        raise ValueError("--resume continues a run and --overwrite replaces it; give one of them")
    links = [path for path in (out / name for name in (*RUN_FILES, *RUN_DIRS)) if path.is_symlink()]
    if links:  # open("w") and rmtree would follow it out of the run: another run's or the user's files
        raise ValueError(f"{links[0]} is a symbolic link; a run writes its files only inside its own directory: "
                         f"remove the link (or copy what it points to into the run)")
    if resume or not any(p.name != LOCK and ".tmp-" not in p.name for p in out.iterdir()):
        return
    if not is_run_directory(out):
        raise ValueError(f"--out {out} is not empty and holds no nesgpu run; choose an empty or new directory")
    if not overwrite:
        raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or --overwrite to "
                         f"replace it")


def moved_aside(out: Path) -> str:
    """A sentence naming the old runs an --overwrite moved aside in ``out`` and could not put back ("" if none),
    for errors about a run directory that holds no usable run."""
    asides = sorted(str(a) for a in Path(out).glob(f"{REPLACED}-*"))
    if not asides:
        return ""
    return (f"; {asides[0]} holds the run an --overwrite moved aside before its process was killed: move its files "
            f"back into {out} to use it")


def clear(out: Path) -> None:
    """Remove what killed writes left behind (a checkpoint directory or a file being written)."""
    for leftover in out.glob(".*.tmp-*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    for aside in out.glob(f"{REPLACED}-*"):
        warnings.warn(f"{aside} holds a run that an --overwrite moved aside and could not put back (its process "
                      f"was killed before the new run's first step); move its files back, or delete it")


class Replacement:
    """``--overwrite``: the old run's files move aside (``DIR/.replaced-PID``) when the new run starts writing,
    come back if the new run fails before its first step (an allocation failure, a bad option the build did not
    catch, Ctrl-C), and are deleted once it has made that step."""

    def __init__(self, out: Path):
        self.out, self.aside = out, None

    def stash(self) -> None:
        if not is_run_directory(self.out):
            return
        self.aside = self.out / f"{REPLACED}-{os.getpid()}"
        self.aside.mkdir()
        for name in (*RUN_FILES, *RUN_DIRS):
            if (self.out / name).exists():
                os.replace(self.out / name, self.aside / name)

    def discard(self) -> None:
        """The new run has made its first step: the old one goes."""
        if self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)
            self.aside = None

    def restore(self) -> None:
        """The new run failed before its first step: its files go and the old run's come back."""
        if self.aside is None:
            return
        for name in RUN_FILES:
            (self.out / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(self.out / name, ignore_errors=True)
        for path in self.aside.iterdir():
            os.replace(path, self.out / path.name)
        self.aside.rmdir()
        self.aside = None


class RunLock:
    """``DIR/.lock`` while this process writes the run; refuses a live other writer."""

    def __init__(self, out: Path):
        self.path = out / LOCK
        self.held = self.created = False

    def __enter__(self) -> RunLock:
        out = self.path.parent
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; expected a directory for the run")
        if out.is_symlink() and not out.exists():
            if _loops(out):
                raise ValueError(f"--out {out} is a symbolic link ({out} -> {os.readlink(out)}) that leads back to "
                                 f"itself; remove the link or choose another --out")
            raise ValueError(f"--out {out} is a symbolic link to {os.readlink(out)}, which does not exist; create "
                             f"that directory or choose another --out")
        self.created = not out.exists()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the run directory {out}: {e.strerror}") from e
        me = f"{socket.gethostname()}:{os.getpid()}"
        for _ in range(3):
            # the pid is in the file before the file has its name: a reader never sees an empty lock
            tmp = out / f".{LOCK}.tmp-{os.getpid()}"
            try:
                tmp.write_text(me)
                os.link(tmp, self.path)
            except FileExistsError:
                owner = _read(self.path)
                if owner is not None and _alive(owner):
                    raise ValueError(_held(self.path, owner)) from None
                if _read(self.path) == owner:  # still the same stale lock: its process is gone
                    self.path.unlink(missing_ok=True)
                continue
            except OSError as e:
                raise ValueError(f"cannot write into the run directory {out}: {e.strerror}") from e
            finally:
                tmp.unlink(missing_ok=True)
            self.held = True
            return self
        raise ValueError(f"cannot take the lock {self.path}: another process keeps taking it")

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
            if self.created and not any(self.path.parent.iterdir()):  # a run that failed before writing a file
                self.path.parent.rmdir()


def _read(path: Path) -> str | None:
    """A lock file's owner ("host:pid"); None for one that cannot be read (a FIFO, a file that is no lock)."""
    try:
        return read_text(path, limit=4096).strip() or None
    except (OSError, ValueError):
        return None


def _loops(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _held(lock: Path, owner: str) -> str:
    """Why a run may not write where ``lock`` names a live ``owner`` ("host:pid"), or one on another host."""
    host, _, pid = owner.rpartition(":")
    if host and host != socket.gethostname():
        return (f"{lock.parent} is locked by process {pid} on host {host} ({lock}), which this host "
                f"({socket.gethostname()}) cannot check: if a run there still writes into it, wait for it or choose "
                f"another --out; if not (a run directory copied from that host), remove {lock}")
    return f"{lock.parent} is being written by another process ({owner}); wait for it, or choose another --out"


def _alive(owner: str) -> bool:
    """Whether the lock's owner ("host:pid") still runs. Another host's process cannot be checked: live.
    This process's own pid is not a live owner: a restarted container reuses pid 1."""
    host, _, pid = owner.rpartition(":")
    if host and host != socket.gethostname():
        return True
    try:
        pid_number = int(pid)
    except ValueError:
        return False
    if pid_number == os.getpid():
        return False
    try:
        os.kill(pid_number, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def differences(old: dict, new: dict, names) -> list[str]:
    """``name: old -> new`` for each option of ``names`` whose value differs between two config mappings (lists and
    tuples compare equal; an option under its side's mapping is named ``task_options.NAME``)."""
    def norm(v):
        return list(v) if isinstance(v, tuple) else v
    old, new = keyed(old), keyed(new)
    keys = [key for name in names for key in old if key.rpartition(".")[2] == name]  # in the order of names
    # an option the old run did not record (see old_runs) is not a difference
    return [f"{n}: {old[n]!r} -> {new.get(n)!r}" for n in keys if norm(old[n]) != norm(new.get(n))]


def option_names(values: dict) -> list[str]:
    """The options a config mapping names (a side's mapping's entries by their own names)."""
    return list(dict.fromkeys(key.rpartition(".")[2] for key in keyed(values)))
