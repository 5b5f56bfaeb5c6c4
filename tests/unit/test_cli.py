"""Every entry point answers a user mistake with one clear line and exit status 2, not a traceback; a bug (any
other exception, ValueError included) keeps its traceback and exits 1; `mohge --help` lists every command."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from mohge_studies.analysis import utilization
from mohge_studies.config import param_report as params

from mohge import cli, data
from mohge.core.knobs import ConfigError
from mohge.evaluate import suite as evaluate
from mohge.evaluate import traces


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
        (ConfigError("data.seed=-1: must be >= 0", key="data.seed", value=-1), 2, "data.seed=-1: must be >= 0"),
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


ROOT = Path(__file__).resolve().parents[2]


def test_mohge_help_lists_every_subcommand_with_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()}
    assert set(cli.COMMANDS) <= listed, out
    assert all(text and "\n" not in text for _, text in cli.COMMANDS.values())


def test_every_runnable_module_is_a_subcommand_or_a_launched_worker():
    """A module runnable by name (`__main__.py` or a `__main__` guard) is reached through `mohge <command>`, except
    the ones that torchrun or a GPU box launches by module name."""
    launched = {
        "mohge.__main__",  # python -m mohge
        "mohge.train.__main__",  # torchrun -m mohge.train, the training rule
        "mohge.data.__main__",  # the data rules
        "mohge.evaluate.__main__",  # the eval rule
        "mohge_studies.bench.__main__",  # the inference rule
        "mohge_studies.analysis.ep_timing",  # torchrun, launched by mohge utilization --measure
        "mohge.train.distributed.ep_equivalence",  # torchrun, the tests
        "mohge.train.distributed.gpu_check",  # torchrun, kernels/gpu_train_check.sh
        "mohge.kernels.bench",  # GPU boxes without an install (also mohge bench kernels)
        "mohge.kernels.gpu_profile",  # GPU boxes, kernels/gpu_check.sh
        "mohge.kernels.device_record",  # GPU boxes before the install, kernels/gpu_all.sh (a file, stdlib only)
        "mohge_studies.bench.step_worker",  # launched by mohge bench step, one process per code version
    }
    runnable = set()
    for base, prefix in ((ROOT / "src" / "mohge", "mohge"), (ROOT / "kernels", "mohge.kernels")):
        for path in base.rglob("*.py"):
            name = ".".join([prefix, *path.relative_to(base).with_suffix("").parts])
            guard = any(
                isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in ast.parse(path.read_text()).body
            )
            if path.name == "__main__.py" or guard:
                runnable.add(name)
    owners = {module for module, _ in cli.COMMANDS.values()}
    assert runnable - launched == set(), "make it a subcommand of mohge.cli"
    assert {"mohge.train.trainer", "mohge.evaluate.suite", "mohge.data.prepare", "mohge_studies.bench"} <= owners


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["trian"])
    assert done.value.code == 2 and "unknown command 'trian'" in capsys.readouterr().err


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mohge", *args], capture_output=True, text=True, env=env)


def test_a_user_error_exits_2_with_one_line(tmp_path):
    done = _run("params", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ConfigError" in lines[0] and "missing.yaml" in lines[0], done.stderr


def test_a_bug_exits_1_with_its_traceback(tmp_path):
    """A ValueError from inside the code (here a monkeypatched parameter count) is a bug, not a bad config."""
    script = (
        "import sys, mohge.config.sizes as p\n"
        "def boom(*a, **k): raise ValueError('zip() argument 2 is shorter than argument 1')\n"
        "p.count_params = boom\n"
        "from mohge.cli import main\n"
        f"sys.exit(main(['params', {str(ROOT / 'configs' / 'models' / 'mohge-3b.yaml')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" in done.stderr and "ValueError: zip()" in done.stderr


def test_a_bug_in_a_wrapped_main_propagates(monkeypatch):
    from mohge.core.cli import user_errors

    @user_errors
    def main(argv=None) -> int:
        raise ValueError("operands could not be broadcast together")

    monkeypatch.delenv("MOHGE_DEBUG", raising=False)
    with pytest.raises(ValueError, match="broadcast"):
        main([])


def test_the_user_error_carries_its_key_and_value():
    from mohge.config import ModelConfig

    with pytest.raises(ConfigError) as err:
        ModelConfig.from_dict({"d_model": 0})
    assert err.value.key == "d_model" and err.value.value == 0 and str(err.value).startswith("d_model=0")


def test_train_help_names_the_mohge_command_and_the_module_still_runs(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["train", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: mohge train ")
    module = subprocess.run([sys.executable, "-m", "mohge.train", "--help"], capture_output=True, text=True)
    assert module.returncode == 0 and "python -m mohge.train" in module.stdout, module.stderr
