"""Every entry point answers a user mistake with one clear line and exit status 2, not a traceback."""

from __future__ import annotations

import logging

import pytest

from mohge import data
from mohge.analysis import utilization
from mohge.evaluate import metrics as evaluate
from mohge.evaluate import traces
from mohge.model import params


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (params.main, ["missing.yaml"]),
        (data.main, ["--config", "missing.json", "--out", "OUT"]),
        (evaluate.main, ["--ckpt", "missing", "--data", "missing", "--out", "OUT/m.json"]),
        (traces.main, ["--ckpt", "missing", "--data", "missing", "--out", "OUT/t.json"]),
        (utilization.main, ["--trace", "missing.json", "--out", "OUT"]),
    ],
)
def test_missing_input_is_named_with_status_2(main, argv, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOHGE_DEBUG", raising=False)
    with caplog.at_level(logging.ERROR):
        assert main(argv) == 2
    assert "missing" in caplog.text
    assert not (tmp_path / "OUT").exists() or not any((tmp_path / "OUT").iterdir())


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (OSError(28, "No space left on device", "/x/state.pt"), 4, "No space left on device (ENOSPC): /x/state.pt"),
        (PermissionError(13, "Permission denied", "/x"), 4, "Permission denied (EACCES): /x"),
        (OSError(4, "Interrupted system call"), 4, "Interrupted system call (EINTR)"),
        (ValueError("data.seed=-1: must be >= 0"), 2, "data.seed=-1: must be >= 0"),
    ],
)
def test_documented_exit_codes_and_debug_traceback(error, code, line, monkeypatch, caplog):
    from mohge.core.cli import user_errors

    @user_errors
    def main(argv=None) -> int:
        raise error

    monkeypatch.delenv("MOHGE_DEBUG", raising=False)
    assert main([]) == code
    assert line in caplog.text and caplog.text.count("\n") == 1
    monkeypatch.setenv("MOHGE_DEBUG", "1")
    with pytest.raises(type(error)):
        main([])


def test_an_unexpected_os_error_is_a_bug_and_keeps_its_traceback(monkeypatch):
    from mohge.core.cli import user_errors

    @user_errors
    def main(argv=None) -> int:
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.delenv("MOHGE_DEBUG", raising=False)
    with pytest.raises(ConnectionResetError):
        main([])
