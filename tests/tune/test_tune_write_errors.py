"""A tune directory that cannot be written is one line saying so (issue 55): a full disk names study.db and says
it cannot be written (not "cannot be read"), and a read-only --out says the directory is not writable (not a
sentence about checkpoints)."""

import errno
import os
import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from nesgpu.cli import main
from nesgpu.train import TrainConfig
from nesgpu.tune import study as study_module
from nesgpu.tune import tune

FLAGS = ["--task", "digits", "--steps", "2", "--population", "4", "--hidden", "4", "--log", "none", "--device", "cpu"]


def disk_full(*args, **kwargs):
    raise OperationalError("INSERT INTO studies", {}, sqlite3.OperationalError("database or disk is full"))


def one_line(capsys, out, code=2):
    with pytest.raises(SystemExit) as stop:
        main(["tune", *FLAGS, "--trials", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == code and len(err) == 1, err
    return err[0]


def test_a_full_disk_when_the_study_opens_says_study_db_cannot_be_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(study_module, "load_study", disk_full)
    assert one_line(capsys, tmp_path / "t") == (
        f"nesgpu tune: error: {tmp_path / 't' / 'study.db'} cannot be written: the disk is full (SQLite: database or "
        f"disk is full); free space on it, or choose another --out")


def test_a_full_disk_while_the_trials_run_says_so_too(tmp_path, monkeypatch):
    monkeypatch.setattr(study_module, "optimize", disk_full)
    with pytest.raises(ValueError, match=r"study\.db cannot be written: the disk is full"):
        tune(TrainConfig(task="digits", steps=2, population=4, hidden=(4,), log="none"), trials=1,
             out=tmp_path / "t", log=lambda *a, **k: None)


def test_a_read_only_out_says_the_directory_is_not_writable(tmp_path, monkeypatch, capsys):
    out = tmp_path / "t"
    real_open = os.open

    def read_only(path, *args, **kwargs):  # what a read-only file system answers, even to root
        if str(path).startswith(str(out)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    line = one_line(capsys, out)
    assert line.startswith(f"nesgpu tune: error: --out {out}: the directory is not writable "
                           f"({os.strerror(errno.EROFS)}: {out}{os.sep}")
    assert line.endswith("); nesgpu tune writes study.db, the trials' runs and its outputs there: choose another --out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a directory of mode 0o500")
@pytest.mark.parametrize("inside", ["", "sub"])
def test_a_directory_without_write_permission_is_named(tmp_path, capsys, inside):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        line = one_line(capsys, locked / inside if inside else locked)
    finally:
        locked.chmod(0o700)
    assert "the directory is not writable (Permission denied" in line and "checkpoints" not in line
