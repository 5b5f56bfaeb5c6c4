"""`make test` runs the suite with pytest-xdist's --dist loadgroup: the tests of one xdist_group run on one worker
(one smoke run, one trained model each), with the pytest that constraints.txt pins."""

from __future__ import annotations

import subprocess
import sys


def test_tests_of_one_xdist_group_run_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(
        "import os\n"
        "import pytest\n\n\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "@pytest.mark.xdist_group('shared')\n"
        "def test_grouped(i, tmp_path_factory):\n"
        f"    with open({str(tmp_path / 'workers.txt')!r}, 'a') as fh:\n"
        "        fh.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n\n\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    pass\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    workers = (tmp_path / "workers.txt").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
