"""Run directories: who may write into one, and what a resumed run may change.

- A new run refuses an existing run directory unless told to ``overwrite`` it; a directory that holds
  anything but a run is never cleared.
- A lock file (``DIR/.lock``, holding the writer's pid) stops a second process from writing into a live
  run; the lock of a process that no longer exists is taken over.
- Temporary files and directories left by a killed write are removed when the next run starts.
- On resume, the options that define the run must match the checkpoint's; the others may change.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# options that define a run: changing them would make the checkpoint another run's
DEFINING = ("task", "model", "layer", "layer_options", "hidden", "population", "antithetic", "seed", "strategy",
            "batch_size", "episodes", "shaping", "ars_version", "top_b")
# files a run writes (what --overwrite removes)
RUN_FILES = ("config.json", "summary.json", "metrics.csv", "model.safetensors", "curve.png")
RUN_DIRS = ("checkpoint", "checkpoint.prev", "tensorboard")
LOCK = ".lock"


def is_run_directory(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "checkpoint").is_dir()


def prepare(out: Path, resume: bool, overwrite: bool) -> None:
    """Check that a run may write into ``out`` (which the caller holds the lock of), and clear what a new
    run replaces and what killed writes left behind."""
    if resume and overwrite:
        raise ValueError("--resume continues a run and --overwrite replaces it; give one of them")
    for leftover in out.glob(".*.tmp-*"):  # a write that was killed (a checkpoint directory or a file)
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    if resume or not any(p.name != LOCK for p in out.iterdir()):
        return
    if not is_run_directory(out):
        raise ValueError(f"--out {out} is not empty and holds no run; choose an empty or new directory")
    if not overwrite:
        raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or --overwrite to "
                         f"replace it")
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)


class RunLock:
    """``DIR/.lock`` while this process writes the run; refuses a live other writer."""

    def __init__(self, out: Path):
        self.path = out / LOCK
        self.held = False

    def __enter__(self) -> RunLock:
        out = self.path.parent
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; expected a directory for the run")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the run directory {out}: {e.strerror}") from e
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pid = _read_pid(self.path)
                if pid is not None and _alive(pid):
                    raise ValueError(f"{self.path.parent} is being written by another process (pid {pid}); wait for "
                                     f"it, or choose another --out") from None
                self.path.unlink(missing_ok=True)  # a stale lock: its process is gone
                continue
            except OSError as e:
                raise ValueError(f"cannot write into the run directory {self.path.parent}: {e.strerror}") from e
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self.held = True
            return self
        raise ValueError(f"cannot take the lock {self.path}")

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def differences(old: dict, new: dict, names) -> list[str]:
    """``name: old -> new`` for each of ``names`` whose value differs (lists and tuples compare equal)."""
    def norm(v):
        return list(v) if isinstance(v, tuple) else v
    # an option the old run did not record (an older nesgpu) is not a difference
    return [f"{n}: {old.get(n)!r} -> {new.get(n)!r}" for n in names if n in old and norm(old[n]) != norm(new.get(n))]
