"""Files written whole or not at all (a temporary sibling, fsync, ``os.replace``); log rows appended whole;
one writer per output folder (a lock file naming its holder)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are shared files
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def append_line(path: str | Path, line: str) -> None:
    """Append one whole line with a single ``os.write`` on an O_APPEND descriptor, then fsync: a reader or a
    concurrent appender never sees half a row, and a kill loses at most the row being written."""
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        written = os.write(fd, data)
        if written != len(data):  # a short write on a full disk: report it rather than leave a torn row
            raise OSError(errno.ENOSPC, f"short write to {path} ({written} of {len(data)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one writer per output folder

LOCK_NAME = ".mohge.lock"


class LockedError(RuntimeError):
    """Another process writes to this folder: the message names its pid, host and start time."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


@contextlib.contextmanager
def output_lock(folder: str | Path, log: logging.Logger | None = None) -> Iterator[Path]:
    """Hold ``folder/.mohge.lock`` (pid, host, start time) while writing into ``folder``. A lock of a live
    process, or of any process on another host (whose liveness cannot be seen from here), is a LockedError;
    a lock left by a dead process on this host is taken over, with a log line."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for _ in range(3):  # a takeover races at most with another takeover
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text())
                pid, host = int(holder["pid"]), str(holder["host"])
            except (OSError, ValueError, KeyError, TypeError):
                holder, pid, host = {}, -1, me["host"]  # a torn lock file: its writer died mid-write
            if host != me["host"] or (pid > 0 and _pid_alive(pid)):
                raise LockedError(
                    f"{folder} is being written by pid {pid} on {host} (since {holder.get('started', '?')}); "
                    f"wait for it, or delete {path} if that process is gone"
                ) from None
            (log or logging.getLogger("mohge")).warning(
                "taking over the stale lock %s of pid %s on %s (since %s)", path, pid, host, holder.get("started")
            )
            path.unlink(missing_ok=True)
            continue
        try:
            os.write(fd, json.dumps(me).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        break
    else:
        raise LockedError(f"{folder}: could not take the lock {path}")
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, OSError):
            if json.loads(path.read_text()).get("pid") == me["pid"]:
                path.unlink()
