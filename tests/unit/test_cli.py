"""Every entry point answers a user mistake with one clear line and exit status 2, not a traceback."""

from __future__ import annotations

import logging

import pytest

from mohge import data, evaluate, params, traces, utilization


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
