"""The package finds its kernels because it is installed: no __path__ edit, no PYTHONPATH, from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mohge

ROOT = Path(__file__).resolve().parents[2]


def test_mohge_has_one_path_entry():
    assert len(mohge.__path__) == 1, mohge.__path__  # nothing appends the repository root


def test_kernels_import_from_elsewhere_without_pythonpath(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import mohge, mohge.kernels, mohge.kernels.reference as r; print(mohge.kernels.__file__); print(r.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    kernels_init, reference = (Path(p) for p in done.stdout.split())
    assert kernels_init.name == "__init__.py" and reference.parent == kernels_init.parent
    # An editable install maps mohge.kernels to this checkout's kernels/; a regular one to site-packages.
    assert kernels_init.parent == ROOT / "kernels" or kernels_init.parent.parts[-2:] == ("mohge", "kernels")


def test_license_is_an_spdx_string_and_the_build_backend_does_not_warn(tmp_path):
    """pyproject's `license` is the SPDX string (PEP 639), not the TOML table setuptools deprecates: building the
    metadata, as `pip install -e .` in setup.sh does, prints no warning and records License-Expression."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert not any("License ::" in c for c in project.get("classifiers", []))  # PEP 639: no license classifier
    code = f"import setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel({str(tmp_path)!r}))"
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stderr
    (metadata,) = tmp_path.glob("*.dist-info/METADATA")
    assert "License-Expression: Apache-2.0" in metadata.read_text()
