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
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def share(path: str | Path) -> None:
    """Give ``path`` the mode a plain ``open`` would (0666 less the umask, 0644 usually): temporary files are
    made 0600 (``mkstemp``, and so by writers that use it, such as ``save_pretrained``), results are shared."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    share(tmp)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if err.filename is None:  # a write or fsync error names no file: name the one being written
            raise OSError(err.errno, err.strerror or str(err), str(tmp)) from err
        raise
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
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)", str(path))
        os.fsync(fd)
    except OSError as err:
        if err.filename is None:  # os.write / os.fsync name no file
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one writer per output folder

LOCK_NAME = ".mohge.lock"
HEARTBEAT_S = 60.0  # the holder touches its lock this often
STALE_AFTER_S = 600.0  # a lock untouched this long has lost its holder


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


def _read_lock(path: Path) -> tuple[str, dict, float] | None:
    """(raw text, parsed holder or {}, age in seconds) of a lock file; None when it is gone."""
    try:
        raw, age_s = path.read_text(), time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(raw)
        holder = {"pid": int(holder["pid"]), "host": str(holder["host"]), "started": holder.get("started", "?")}
    except (ValueError, KeyError, TypeError):
        holder = {}
    return raw, holder, age_s


def _take_over_if_stale(path: Path, folder: Path, my_host: str, log: logging.Logger) -> None:
    """Remove the lock at ``path`` if its holder is gone, else raise LockedError naming the holder. Takeovers
    are serialised by a second O_EXCL file, and the lock is re-read under it, so two processes never both
    remove a lock and both go on."""
    found = _read_lock(path)
    if found is None:
        return
    raw, holder, age_s = found
    if not holder:  # empty or torn: being written right now, or its writer died mid-write long ago
        if age_s < 10:
            raise LockedError(f"{folder}: another process is taking the lock {path} right now")
        holder = {"pid": -1, "host": my_host, "started": "?"}
    pid, host = holder["pid"], holder["host"]
    dead = host == my_host and not (pid > 0 and _pid_alive(pid))
    if not dead and age_s < STALE_AFTER_S:
        raise LockedError(
            f"{folder} is being written by pid {pid} on {host} (since {holder['started']}); "
            f"wait for it, or delete {path} if that process is gone"
        )
    guard = path.with_name(path.name + ".takeover")
    try:
        os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - guard.stat().st_mtime > 10:  # left by a takeover that died
                guard.unlink()
        return
    try:
        again = _read_lock(path)
        if again is not None and again[0] == raw:  # still the stale holder's lock, not a new one
            why = "its process is gone" if dead else f"no heartbeat for {age_s:.0f} s"
            log.warning(
                "taking over the stale lock %s of pid %s on %s (since %s): %s", path, pid, host, holder["started"], why
            )
            path.unlink()
    finally:
        guard.unlink(missing_ok=True)


@contextlib.contextmanager
def output_lock(folder: str | Path, log: logging.Logger | None = None) -> Iterator[Path]:
    """Hold ``folder/.mohge.lock`` (pid, host, start time) while writing into ``folder``; a thread touches it
    every HEARTBEAT_S. A lock of a live process is a LockedError naming it. A lock is stale, and taken over with
    a log line, when its process is dead on this host, or when its heartbeat is older than STALE_AFTER_S (a
    process on another host, e.g. a job that a scheduler killed and requeued elsewhere)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    for _ in range(3):  # a takeover races at most with another takeover
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            _take_over_if_stale(path, folder, me["host"], log or logging.getLogger("mohge"))
            continue
        try:
            os.write(fd, json.dumps(me).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        break
    else:
        raise LockedError(f"{folder}: could not take the lock {path} (other processes are taking it)")
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(path)

    beat = threading.Thread(target=heartbeat, name="mohge-lock-heartbeat", daemon=True)
    beat.start()
    try:
        yield path
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(FileNotFoundError, ValueError, OSError):
            if json.loads(path.read_text()).get("pid") == me["pid"]:
                path.unlink()
