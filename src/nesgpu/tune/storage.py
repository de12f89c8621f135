"""Where a study lives: ``DIR/study.db`` (SQLite, Optuna's ``RDBStorage`` with its trial heartbeats), a lock
for the moments processes must take turns, and the check that a resumed study is the same study.

- Several ``nesgpu tune`` processes may share one DIR. They take turns (``DIR/.tune.lock``, an exclusive
  ``filelock.FileLock``) to open the database, to count the trials and to start a new one, so that the
  number of trials is capped exactly and the database tables are created once. (Optuna's
  ``MaxTrialsCallback`` counts only after a trial ends, so parallel processes overshoot its cap; a
  ``JournalStorage`` locks each write, not a count and the start of a trial, and has no heartbeats.)
- A running trial's process records a heartbeat every ``heartbeat`` seconds; a trial whose heartbeat is
  older than three beats (its process was killed) is marked failed by the next process that starts a trial
  (:func:`optuna.storages.fail_stale_trials`), so it does not hold a place forever.
- The study keeps its base config and search space as user attributes; another base config or space in the
  same DIR is refused, so that its trials stay comparable.
"""

from __future__ import annotations

import contextlib
import errno
import json
import threading
import warnings
from pathlib import Path

import optuna
from filelock import FileLock

DB = "study.db"
LOCK = ".tune.lock"
# options of the base config that do not change what a trial computes: they may differ between the
# processes (and the sessions) of one study
RUN_ONLY = ("out", "device", "progress_every", "log", "chunk_size", "dist_timeout")
IDENTITY = ("base_config", "space")  # user attributes that must match to continue a study
SETTINGS = ("sampler", "pruner")  # user attributes that may differ (with a warning)


def locked(out: Path) -> FileLock:
    """The exclusive lock ``out/.tune.lock`` of the processes sharing the tune directory ``out``."""
    return FileLock(out / LOCK)


@contextlib.contextmanager
def writable_directory(out: Path):
    """A tune directory that cannot be created or written (read-only, not permitted) is one ValueError."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        where = f": {e.filename}" if e.filename and e.filename != str(out) else ""
        raise ValueError(f"--out {out}: the directory is not writable ({e.strerror}{where}); nesgpu tune writes "
                         f"study.db, the trials' runs and its outputs there: choose another --out") from e


def make_directory(out: Path) -> None:
    """Create the tune directory ``out`` (and its parents) where it is not there; a ValueError where it cannot be
    (what cannot be written in it is named where :func:`locked` opens its lock file)."""
    with writable_directory(out):
        out.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def readable_database(out: Path):
    """A study.db that SQLite cannot read (damaged, not a database, unreadable) or write (a full disk, a read-only
    file or directory) is one ValueError saying which, not SQLAlchemy's traceback."""
    from sqlalchemy.exc import DatabaseError

    try:
        yield
    except DatabaseError as e:
        raise ValueError(database_error(out, str(getattr(e, "orig", None) or e).splitlines()[0])) from e


def database_error(out: Path, reason: str) -> str:
    """What SQLite's ``reason`` means for the study database of ``out``."""
    if "disk is full" in reason:
        return (f"{out / DB} cannot be written: the disk is full (SQLite: {reason}); free space on it, or choose "
                f"another --out")
    if "readonly" in reason or "unable to open" in reason:
        return (f"{out / DB} cannot be written: the file or its directory {out} is not writable (SQLite: {reason}); "
                f"choose another --out")
    return (f"{out / DB} cannot be read as a study database ({reason}); move it away to start a new study there, "
            f"or choose another --out")


def open_storage(out: Path, heartbeat: int, on_stale=None) -> optuna.storages.RDBStorage:
    """The SQLite storage ``out/study.db`` with trial heartbeats every ``heartbeat`` seconds; a trial is stale
    after three missed beats, and ``on_stale(study, frozen_trial)`` is called for each stale trial this process
    marks failed. SQLite waits up to a minute for another process's write."""
    with quiet_optuna():
        return optuna.storages.RDBStorage(f"sqlite:///{(out / DB).resolve()}",
                                          engine_kwargs={"connect_args": {"timeout": 60}},
                                          heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                                          heartbeat_stale_trial_callback=on_stale)


def load_study(storage, out: Path, name: str | None, attrs: dict, sampler, pruner) -> optuna.Study:
    """The study of ``out`` (created if there is none): one study per directory, as its trials' run
    directories are ``out/trials/NNNN``.

    Args:
        storage: from :func:`open_storage`.
        out: the tune directory.
        name: the study's name; None: the one study in the database, or the directory's name.
        attrs: the user attributes that define the study (:data:`IDENTITY`) and how it samples
            (:data:`SETTINGS`); a new study stores them, an existing one must have the same identity.
        sampler, pruner: the Optuna sampler and pruner of this process.

    Raises:
        ValueError: another study in the database, or a study with another base config or space.
    """
    names = optuna.get_all_study_names(storage)
    if names and name not in (None, names[0]):
        raise ValueError(f"{out / DB} holds study {names[0]!r}, not {name!r}; a directory holds one study: drop "
                         f"--study-name or choose another --out")
    name = names[0] if names else (name or out.resolve().name)
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize", sampler=sampler,
                                pruner=pruner, load_if_exists=True)
    if not study.user_attrs:
        _check_no_old_trials(study, out)
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        return study
    _check_identity(study, attrs, out)
    for key in SETTINGS:
        if study.user_attrs.get(key) != attrs[key]:
            warnings.warn(f"the study in {out} was started with --{key} {study.user_attrs.get(key)}; this process "
                          f"uses {attrs[key]}", stacklevel=3)
    return study


def _check_no_old_trials(study: optuna.Study, out: Path) -> None:
    """A new study in a directory whose trials/ holds runs would write over them."""
    if study.trials:
        raise ValueError(f"{out / DB}: study {study.study_name!r} has trials but no nesgpu tune settings; it was "
                         f"not made by nesgpu tune (choose another --out)")
    runs = sorted(p.name for p in (out / "trials").glob("*") if p.is_dir())
    if runs:
        shown = ", ".join(runs[:3]) + (" ..." if len(runs) > 3 else "")
        raise ValueError(f"{out / 'trials'} holds run directories ({shown}) of a study that is no longer in "
                         f"{out / DB}; remove them or choose another --out")


def _check_identity(study: optuna.Study, attrs: dict, out: Path) -> None:
    for key in IDENTITY:
        old, new = study.user_attrs.get(key), attrs[key]
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):  # (an option left unset is None, or absent)
            changed = [f"{k}: {old.get(k)!r} there, {new.get(k)!r} here" for k in sorted(set(old) | set(new))
                       if old.get(k) != new.get(k)]
            if not changed:
                continue
        else:
            changed = [f"{old!r} there, {new!r} here"]
        what = "base config" if key == "base_config" else "search space"
        shown = "; ".join(changed[:4]) + (" ..." if len(changed) > 4 else "")
        raise ValueError(f"{out} holds a study with another {what} ({shown}); run it with the same options, or "
                         f"choose another --out")


def as_json(value) -> object:
    """``value`` as JSON gives it back (tuples become lists): what the study's user attributes store."""
    return json.loads(json.dumps(value))


@contextlib.contextmanager
def quiet_optuna():
    """Without Optuna's notes that heartbeats, fail_stale_trials and the plots are experimental, and that
    heartbeats are meant for ``Study.optimize`` (the loop here keeps them itself: :func:`heartbeat`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
        yield


@contextlib.contextmanager
def heartbeat(storage, trial_id: int):
    """Record the trial's heartbeat now and every ``storage.heartbeat_interval`` seconds, in a thread, while
    the block runs (the training releases the GIL in its tensor operations). Optuna's own heartbeat thread runs
    only inside ``Study.optimize``, which starts its trials without the count under :func:`locked`."""
    interval = storage.get_heartbeat_interval()
    storage.record_heartbeat(trial_id)
    stop = threading.Event()

    def beat():
        while not stop.wait(interval):
            storage.record_heartbeat(trial_id)

    thread = threading.Thread(target=beat, name=f"nesgpu-tune-heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def trial_id(storage, study: optuna.Study, number: int) -> int:
    """The storage's id of the study's trial ``number`` (what heartbeats are recorded under)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name),
                                                           number)


__all__ = ["DB", "IDENTITY", "LOCK", "RUN_ONLY", "SETTINGS", "as_json", "heartbeat", "load_study", "locked",
           "make_directory", "open_storage", "quiet_optuna", "readable_database", "trial_id", "writable_directory"]
