"""Atomic files, whole-row appends and the one-writer lock."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import pytest

from mohge.core.atomic import LOCK_NAME, STALE_AFTER_S, LockedError, append_line, output_lock


def _append_rows(path: str, tag: str, n: int) -> None:
    for i in range(n):
        append_line(path, json.dumps({"tag": tag, "i": i, "pad": "x" * 300}))


def test_concurrent_appends_never_tear_or_lose_a_row(tmp_path):
    path = str(tmp_path / "log.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_rows, args=(path, tag, 100)) for tag in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    rows = [json.loads(line) for line in open(path).read().splitlines()]
    assert len(rows) == 200 and {(r["tag"], r["i"]) for r in rows} == {(t, i) for t in "ab" for i in range(100)}


def test_a_live_holder_is_named_and_a_stale_lock_is_taken_over(tmp_path, caplog):
    folder = tmp_path / "out"
    with output_lock(folder) as lock:
        held = json.loads(lock.read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        with pytest.raises(LockedError) as err:
            with output_lock(folder):
                pass
        assert f"pid {os.getpid()} on {socket.gethostname()}" in str(err.value) and "\n" not in str(err.value)
    assert not (folder / LOCK_NAME).exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (folder / LOCK_NAME).write_text(json.dumps({"pid": dead_pid, "host": socket.gethostname(), "started": "then"}))
    with caplog.at_level(logging.WARNING), output_lock(folder) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert f"taking over the stale lock {folder / LOCK_NAME} of pid {dead_pid}" in caplog.text
    (folder / LOCK_NAME).write_text(json.dumps({"pid": dead_pid, "host": "elsewhere", "started": "then"}))
    with pytest.raises(LockedError, match=f"pid {dead_pid} on elsewhere"):
        with output_lock(folder):
            pass


def test_a_lock_from_another_host_is_stale_only_without_heartbeat(tmp_path, caplog):
    folder = tmp_path / "out"
    folder.mkdir()
    lock = folder / LOCK_NAME
    lock.write_text(json.dumps({"pid": 1, "host": "node17", "started": "then"}))
    with pytest.raises(LockedError, match="pid 1 on node17"):
        with output_lock(folder):
            pass
    old = time.time() - STALE_AFTER_S - 5
    os.utime(lock, (old, old))  # a job killed on node17 and requeued here: its heartbeat stopped
    with caplog.at_level(logging.WARNING), output_lock(folder):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert "of pid 1 on node17 (since then): no heartbeat for" in caplog.text


def test_the_holder_keeps_its_lock_fresh(tmp_path, monkeypatch):
    import mohge.core.atomic as atomic

    monkeypatch.setattr(atomic, "HEARTBEAT_S", 0.05)
    with output_lock(tmp_path) as lock:
        old = time.time() - 1000
        os.utime(lock, (old, old))
        time.sleep(0.3)
        assert time.time() - lock.stat().st_mtime < 5
