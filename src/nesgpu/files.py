"""Reading the small files of a run or model directory (config.json, summary.json, a drift text, a lock file,
adapter_config.json) as data from a stranger: only a regular file is read (a FIFO would block, /dev/zero would
never end), never more than a stated size, and what cannot be read is a ValueError that names the file and what
was expected."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

LIMIT = 16 << 20  # a run's config.json is a few kB; 16 MiB is far past any real one
DEPTH = 64  # nesting a config never needs; deeper is refused before json's recursion limit is met


def read_bytes(path: str | Path, limit: int = LIMIT) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes. Opened without blocking (a FIFO) and
    checked before a byte is read; OSError for a file that is missing, ValueError for one that is not a regular
    file or is too large."""
    path = Path(path)
    with open_regular(path, "rb") as f:
        info = os.fstat(f.fileno())
        if info.st_size > limit:
            raise ValueError(f"{path} is {info.st_size:,} bytes; expected at most {limit:,}")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise ValueError(f"{path} is over {limit:,} bytes; expected at most {limit:,}")
    return data


def open_regular(path: str | Path, mode: str = "r", **kwargs):
    """``path`` opened for reading (``open``'s ``mode`` and ``kwargs``; text is UTF-8 unless told otherwise), once
    it is known to be a regular file: a FIFO is not waited on, a device never read (a ValueError naming the file)."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file (it is a {_kind(info.st_mode)}); expected a file")
        if "b" not in mode:
            kwargs.setdefault("encoding", "utf-8")
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | Path, limit: int = LIMIT) -> str:
    """``read_bytes`` decoded as UTF-8; a ValueError names the file and the byte that is not UTF-8."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from e


def read_json(path: str | Path, limit: int = LIMIT, depth: int = DEPTH):
    """The JSON value in ``path`` (``read_text``), nested at most ``depth`` deep; a ValueError names the file."""
    text = read_text(path, limit)
    if _depth(text) > depth:
        raise ValueError(f"{path} nests more than {depth} levels deep; expected a run's JSON file")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from e


def read_mapping(path: str | Path, what: str = "a run's mapping of options", limit: int = LIMIT):
    """The JSON object in ``path`` (``read_json``, at most ``limit`` bytes) as a dict; a ValueError, naming the file
    and ``what`` was expected, for one that cannot be read or holds anything else."""
    try:
        values = read_json(path, limit)
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror or e}); expected {what}") from e
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds a {type(values).__name__}; expected {what}")
    return values


def _depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON ``text`` (strings skipped), without parsing it."""
    deepest = level = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


__all__ = ["DEPTH", "LIMIT", "open_regular", "read_bytes", "read_json", "read_mapping", "read_text"]
