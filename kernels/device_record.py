"""The machine a GPU record was measured on: the device's name, clocks, driver, memory, power and compute mode (from
``nvidia-smi``), and the versions of Python and of every package the records depend on.

    python kernels/device_record.py --out OUT/env.json --label start     (kernels/gpu_all.sh, before and after)

Appends one snapshot (``label``, UTC time, ``gpus``: one mapping per GPU, ``versions``, ``cpus``) to the JSON list in
``--out``, so a file holds the clocks before the work and after it. Imports nothing beyond the standard library (it
runs before the checkout is installed, and on a machine without a GPU, where ``gpus`` is empty and ``nvidia_smi``
says why).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

# nvidia-smi --query-gpu fields: what a timing depends on (clocks now and at most, power, temperature, mode)
QUERY = (
    "name", "pci.bus_id", "driver_version", "memory.total", "memory.used", "clocks.sm", "clocks.mem", "clocks.max.sm",
    "clocks.max.mem", "power.draw", "power.limit", "temperature.gpu", "pstate", "compute_mode", "persistence_mode",
)  # fmt: skip
PACKAGES = ("torch", "triton", "numpy", "nvidia-ml-py", "pytest", "snakemake", "lm-eval", "datasets", "pandas",
            "scipy", "matplotlib", "tokenizers", "safetensors", "pyarrow", "huggingface-hub", "mohge")  # fmt: skip


def gpus(smi: str = "nvidia-smi") -> tuple[list[dict[str, str]], str]:
    """(one mapping field -> value per GPU, nvidia-smi's status: "ok" or why there is nothing)."""
    cmd = [smi, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"{smi}: {err}"
    if done.returncode:
        return [], f"{smi}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}"
    rows = [[v.strip() for v in line.split(",")] for line in done.stdout.strip().splitlines() if line.strip()]
    return [dict(zip(QUERY, row, strict=False)) for row in rows], "ok"


def versions() -> dict[str, str | None]:
    """Python and every package of :data:`PACKAGES` (None: not installed), read from their metadata, none imported."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def snapshot(label: str, smi: str = "nvidia-smi") -> dict:
    found, status = gpus(smi)
    return {
        "label": label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpus": found,
        "nvidia_smi": status,
        "versions": versions(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python kernels/device_record.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON list to append the snapshot to")
    ap.add_argument("--label", default="start", help="what the snapshot is (start, end, ...)")
    ap.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to call")
    args = ap.parse_args(argv)
    snaps = json.loads(args.out.read_text()) if args.out.is_file() else []
    snaps.append(snapshot(args.label, args.nvidia_smi))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(snaps, indent=1) + "\n")
    os.replace(tmp, args.out)
    s = snaps[-1]
    names = ", ".join(
        f"{g.get('name')} (driver {g.get('driver_version')}, SM {g.get('clocks.sm')} MHz)" for g in s["gpus"]
    )
    print(f"device_record {args.label}: {names or s['nvidia_smi']}; torch {s['versions']['torch']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
