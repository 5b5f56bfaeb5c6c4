"""Checks of what a run needs from the world, made before anything trains: every refusal is one line.

:func:`check_run` is called by :func:`mohge_studies.config.runs.plan` for every planned run (so the Snakefile and
``mohge runs list`` refuse at parse time) and again by ``python -m mohge.train`` at start:

* the ``text`` source's files: every glob matches a file, no file is empty, every file is UTF-8;
* the eval tasks: a task YAML shipped in ``mohge/tasks``, or one of lm-eval's standard tasks listed in
  ``mohge/tasks/standard.yaml`` when ``eval.allow_hub`` is on (the list is read, lm-eval is not imported);
* the expert backend: ``triton`` needs a GPU, decided from ``train.device`` and the workflow's ``cluster``
  section (``gpus_per_node`` 0 or absent and no CUDA on this machine: the run would train on a CPU);
* the ``hf`` source's ``hf_local_path``: a folder that ``save_to_disk`` wrote;
* the ``hf`` source without ``hf_local_path``: refused while ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` is set.
  Whether the hub answers is asked when the data is prepared (:func:`hub_reachable`, one 3 s connect, no
  retries), not at plan time: a dry run of a cluster config must plan on an offline login node.

:func:`check_writable` is ``mohge.train``'s check of ``--out`` and ``--scratch`` before the first step, and
:func:`check_not_committed` its guard of committed results: a folder holding files git tracks (results/<study>/
runs/<run>) is written only by the run it records (its config.json), else refused before anything is written.
"""

from __future__ import annotations

import codecs
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mohge.core.knobs import ConfigError, load_yaml_or_json
from mohge.core.resources import TASKS

from .data import DataConfig
from .sections import RunConfig

TASK_TEMPLATES = TASKS
HUB_HOST, HUB_PORT, HUB_TIMEOUT_S = "huggingface.co", 443, 3.0
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def known_tasks(templates: Path = TASK_TEMPLATES) -> tuple[list[str], list[str]]:
    """(local task names, standard hub task names) shipped in ``templates``."""
    local = sorted(p.stem for p in templates.glob("*.yaml") if p.stem != "standard")
    standard_file = templates / "standard.yaml"
    standard = list(yaml.safe_load(standard_file.read_text())["standard_tasks"]) if standard_file.is_file() else []
    return local, standard


def check_tasks(cfg: RunConfig, templates: Path = TASK_TEMPLATES) -> None:
    local, standard = known_tasks(templates)
    for i, task in enumerate(cfg.eval.tasks):
        key = f"eval.tasks[{i}]"
        if task in standard and not cfg.eval.allow_hub:
            raise ConfigError(f"{key}={task!r}: a standard lm-eval task downloads its data; set eval.allow_hub: true")
        if task not in local and task not in standard:
            raise ConfigError(
                f"{key}={task!r}: unknown task (local: {', '.join(local)}; with eval.allow_hub: {', '.join(standard)})"
            )
    if cfg.data_config.source == "facts" and "mohge_facts" in cfg.eval.tasks and cfg.eval.limit:
        # B is a sum over every fact (mohge.evaluate.bits_stored): a limited task would store fewer bits, silently
        raise ConfigError(
            f"eval.limit={cfg.eval.limit}: mohge_facts sums the bits stored over every fact; set eval.limit: 0"
        )


def resolve_text_files(patterns: Sequence[str], key: str = "data.text_files") -> list[Path]:
    """Expand paths and globs (`**` allowed) in order, without duplicates; a pattern that matches no
    file is an error naming it (and `key`)."""
    files: list[Path] = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if glob.has_magic(expanded):
            matches = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if Path(p).is_file())
        else:
            matches = [Path(expanded)] if Path(expanded).is_file() else []
        if not matches:
            raise ConfigError(f"{key}={pattern!r}: matches no file")
        files += [p for p in matches if p not in files]
    return files


def check_text_files(patterns: tuple[str, ...]) -> list[Path]:
    """The files of the text source; a glob matching nothing, a missing or empty file, or a file that is not
    UTF-8 is a ConfigError naming it."""
    files = resolve_text_files(patterns)
    for path in files:
        if path.stat().st_size == 0:
            raise ConfigError(f"data.text_files: {path} is empty")
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as err:
                    raise ConfigError(f"data.text_files: {path} is not UTF-8 (byte {offset + err.start})") from err
                offset += len(block)
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as err:
                raise ConfigError(f"data.text_files: {path} is not UTF-8 (it ends inside a character)") from err
    return files


def check_hf_local_path(data: DataConfig, key: str = "data.hf_local_path") -> None:
    """The hf source's ``hf_local_path`` is a folder that ``save_to_disk`` wrote (a Dataset's state.json or a
    DatasetDict's dataset_dict.json in it); ``~`` expands, as ``datasets.load_from_disk`` expands it."""
    if data.source != "hf" or data.hf_local_path is None:
        return
    folder = Path(os.path.expanduser(data.hf_local_path))
    if not folder.is_dir():
        raise ConfigError(f"{key}={data.hf_local_path!r}: no such folder (a dataset saved with save_to_disk)")
    if not any((folder / name).is_file() for name in ("state.json", "dataset_dict.json")):
        raise ConfigError(
            f"{key}={data.hf_local_path!r}: not a dataset saved with save_to_disk (no state.json or dataset_dict.json)"
        )


def offline_variable() -> str | None:
    """The HF offline variable that is set (to anything but 0/false/empty), if any."""
    for var in OFFLINE_VARS:
        if os.environ.get(var, "").strip().lower() not in ("", "0", "false", "no", "off"):
            return var
    return None


def check_hub_allowed(data: DataConfig) -> None:
    if data.source == "hf" and not data.hf_is_local and (var := offline_variable()):
        raise ConfigError(
            f"data.hf_name={data.hf_name!r}: {var} is set, so the hub cannot be reached; "
            "use data.hf_local_path (a dataset saved with save_to_disk)"
        )


def hub_reachable() -> bool:
    """One TCP connect to the hub with a short timeout (no retries)."""
    try:
        with socket.create_connection((HUB_HOST, HUB_PORT), timeout=HUB_TIMEOUT_S):
            return True
    except OSError:
        return False


def check_hub(data: DataConfig) -> None:
    """Before ``datasets.load_dataset`` (which retries for ~40 s): refuse in one line when offline."""
    check_hub_allowed(data)
    if data.source == "hf" and not data.hf_is_local and not hub_reachable():
        raise ConfigError(
            f"data.hf_name={data.hf_name!r}: the hub ({HUB_HOST}:{HUB_PORT}) does not answer "
            f"within {HUB_TIMEOUT_S:.0f} s; use data.hf_local_path on offline machines"
        )


def cuda_present() -> bool:
    """CUDA on this machine, without importing torch when it is not imported yet (plan time stays light)."""
    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    return os.path.exists("/dev/nvidiactl") and os.environ.get("CUDA_VISIBLE_DEVICES", "x") not in ("", "-1")


def trains_on_cpu(cfg: RunConfig, cluster: dict[str, Any] | None) -> bool:
    if cfg.train.device != "auto":
        return cfg.train.device == "cpu"
    return not (cluster or {}).get("gpus_per_node") and not cuda_present()


def cpp_compiler() -> str | None:
    """The C++ compiler torch.compile builds a CPU graph with (inductor's ``cpp.cxx``: ``$CXX``, else ``g++``), found on
    the PATH; None when it is not there."""
    return shutil.which(os.environ.get("CXX") or "g++")


def check_backend(cfg: RunConfig, cluster: dict[str, Any] | None = None, on_cpu: bool | None = None) -> None:
    """``on_cpu``: the device is known (mohge.train); else it is decided from the config and this machine."""
    ffn = cfg.model.ffn
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests)
    on_cpu = trains_on_cpu(cfg, cluster) if on_cpu is None else on_cpu
    if ffn.kind != "dense" and ffn.backend == "triton" and not interpreted and on_cpu:
        raise ConfigError(
            "model.ffn.backend='triton': the Triton kernels need a GPU and this run trains on a CPU "
            "(train.device, cluster.gpus_per_node); use backend auto or torch"
        )
    if cfg.train.fused and on_cpu and cpp_compiler() is None:
        raise ConfigError(
            "train.fused=true: torch.compile builds the fused path's graphs with a C++ compiler on a CPU, and "
            f"{os.environ.get('CXX') or 'g++'} ($CXX, else g++) is not on the PATH; install one or set "
            "train.fused: false"
        )


def check_run(cfg: RunConfig, cluster: dict[str, Any] | None = None, inputs: bool = True) -> None:
    """Everything about one run that can be known before it starts (see the module docstring). ``inputs``:
    also check what preparing its data needs (text files, the hub); off once the data is prepared."""
    data = cfg.data_config
    if inputs and data.source == "text":
        check_text_files(data.text_files)
    if inputs:
        check_hf_local_path(data, f"datasets.{cfg.dataset}.hf_local_path")
        check_hub_allowed(data)
    check_tasks(cfg)
    check_backend(cfg, cluster)


def check_writable(folder: str | Path, what: str) -> None:
    """Create ``folder`` and write a probe file in it: an unwritable output fails now, not after training."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-"):
            pass
    except OSError as err:
        raise ConfigError(f"{what} {folder} is not writable: {err.strerror or err}") from err


def tracked_files(folder: str | Path) -> list[str]:
    """Files git tracks inside ``folder`` (relative to the repository's top); [] outside a git work tree or
    without git."""
    folder = Path(folder).resolve()
    probe = folder
    while not probe.is_dir():
        probe = probe.parent
    try:
        top = subprocess.run(
            ["git", "-C", str(probe), "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=30
        )
        if top.returncode:
            return []
        found = subprocess.run(
            ["git", "-C", top.stdout.strip(), "ls-files", "-z", "--", str(folder)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [f for f in found.stdout.split("\0") if f] if found.returncode == 0 else []


def _training_part(cfg: RunConfig) -> dict[str, Any]:
    """What a trained model depends on (the eval section and the cadence/thread knobs aside)."""
    from mohge.core.knobs import to_dict

    d = to_dict(cfg)
    skip = ("ckpt_every", "keep_checkpoints", "log_every", "eval_every", "eval_batches", "threads")
    return {
        "model": d["model"],
        "loss": d["loss"],
        "data": to_dict(cfg.data_config),
        "train": {k: v for k, v in d["train"].items() if k not in skip},
    }


def check_not_committed(folder: str | Path, what: str, cfg: RunConfig) -> None:
    """Refuse to write into a folder that holds committed files (git tracks some), unless it records this very
    run (its tracked config.json is ``cfg``'s training part): committed results are never overwritten by
    another run. Checked before any file is written."""
    tracked = tracked_files(folder)
    if not tracked:
        return
    folder = Path(folder)
    recorded = folder / "config.json"
    same = False
    if recorded.is_file():
        try:
            same = _training_part(RunConfig.from_dict(load_yaml_or_json(recorded))) == _training_part(cfg)
        except ValueError:
            same = False
    if not same:
        raise ConfigError(
            f"{what} {folder} holds {len(tracked)} committed file(s) ({tracked[0]}, ...) of another run: "
            "committed results are not overwritten; give an --out outside the repository's tracked folders"
        )
