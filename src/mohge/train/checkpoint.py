"""Resumable checkpoints: whole-folder atomic saves, sha256 manifests, and the newest valid one on resume.

Layout of the scratch folder (``python -m mohge.train --scratch``; default ``OUT/.scratch``)::

    step_00000050/             the state after 50 optimizer steps; the next step to run is step 50 (0-based)
      model.safetensors        weights, fp32, names of the unwrapped module
      state.pt                 torch.save: optimizer, scheduler, RNG states (python, numpy, torch CPU, CUDA; per rank)
      data.json                the data position: {"step": 50, "order": "random"} (batches are a pure function of
                               (seed, step)), or with train.data_order sequential also the global "window" to read
                               next and where it is ("epoch", "shard", "offset"; mohge.data.stream.TrainBatches)
      config.json              the resolved run config
      manifest.json            sha256 and size of every file above; written last
    .tmp-step_00000050-PID/    a save in progress; renamed to step_00000050 in one os.replace once complete
    train_log.jsonl            the live training log (see mohge.train)

A SIGKILL at any moment leaves either the previous checkpoints untouched plus a stale ``.tmp-*`` folder, or
the new complete folder: a folder named ``step_*`` always holds a manifest written after every other file.
A folder whose manifest is missing or whose files do not match it (truncated, bit rot) is reported with the
file and both hashes, and the next older valid folder is used.

The final output folder of ``mohge.train`` carries a manifest too (``{"files": {name: sha256}}``, written last by
:func:`write_manifest`). ``load_trained(dir)`` loads a trained model from a final output folder or a checkpoint
folder after :func:`verify_manifest`; evaluation, traces and the lm-eval adapter use it, so a flipped bit in any
file of the folder is refused, naming the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from mohge.config import ConfigError, RunConfig, load_run_config, to_dict
from mohge.core.atomic import sha256_file, write_bytes_atomic, write_json_atomic
from mohge.core.knobs import load_json_file

log = logging.getLogger("mohge.train.checkpoint")

MANIFEST = "manifest.json"
FILES = ("model.safetensors", "state.pt", "data.json", "config.json")
# What a final model folder's manifest must list: the weights, the run config and the tokenizer the model reads
# with (a manifest without tokenizer.json would let a swapped vocabulary change lm-eval's scores unnoticed).
MODEL_FILES = ("model.safetensors", "config.json", "tokenizer.json")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_STEP_DIR = re.compile(r"^step_(\d{8})$")
# train fields that may change between a checkpoint and its resumption without changing the trajectory
RESUMABLE_CHANGES = ("ckpt_every", "keep_checkpoints", "log_every", "eval_every", "eval_batches", "threads")


class CheckpointError(ConfigError):
    """A checkpoint or model folder that cannot be used: the message names the file and what is wrong with it
    (a user error: shown by the commands as one line with status 2)."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------------
# RNG state: every generator a step could touch, as tensors and plain values (loadable with weights_only)
# ----------------------------------------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            log.warning(
                "checkpoint holds CUDA RNG states of %d devices, %d visible: CUDA RNG not restored",
                len(state["cuda"]),
                torch.cuda.device_count(),
            )


def _as_tuple(x: Any) -> Any:
    """random.setstate needs tuples; a round trip through torch.save keeps them, JSON would not."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x


# ----------------------------------------------------------------------------------------------------
# Save, verify, find, load
# ----------------------------------------------------------------------------------------------------


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def save_checkpoint(
    scratch: str | Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    train_state: dict[str, Any],
    config: dict[str, Any],
    keep: int,
    data: dict[str, Any] | None = None,
) -> Path:
    """Write ``scratch/step_{step:08d}`` atomically (temp folder, manifest last, one os.replace), then keep
    only the newest ``keep`` checkpoints. An existing valid folder of the same step is left as it is.
    ``data`` is the data position (``TrainBatches.position``) that data.json holds beside the step."""
    scratch = Path(scratch)
    final = scratch / step_dir_name(step)
    if final.exists():
        try:
            verify_checkpoint(final)
            log.info("checkpoint %s already exists and is valid; not rewritten", final)
            return final
        except CheckpointError as err:
            log.warning("replacing invalid checkpoint: %s", err)
            shutil.rmtree(final)
    tmp = scratch / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    blobs = {
        "model.safetensors": safetensors.torch.save({k: v.detach().cpu().contiguous() for k, v in model_state.items()}),
        "state.pt": _torch_bytes(train_state),
        "data.json": _json_bytes({**(data or {}), "step": step}),
        "config.json": _json_bytes(config),
    }
    try:
        for name, data in blobs.items():
            write_bytes_atomic(tmp / name, data)
        manifest = {
            "format_version": 1,
            "step": step,
            "files": {name: {"sha256": sha256_bytes(data), "bytes": len(data)} for name, data in blobs.items()},
        }
        write_json_atomic(tmp / MANIFEST, manifest)
        _fsync_dir(tmp)
        os.replace(tmp, final)
    except BaseException:  # disk full, killed, ...: the older checkpoints stay as they were, no half folder
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(scratch)
    prune_checkpoints(scratch, keep)
    return final


def list_checkpoints(scratch: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every ``step_*`` folder, newest first (valid or not)."""
    scratch = Path(scratch)
    if not scratch.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in scratch.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def prune_checkpoints(scratch: str | Path, keep: int) -> None:
    for _, path in list_checkpoints(scratch)[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_temps(scratch: str | Path) -> None:
    """Remove ``.tmp-*`` folders left by killed saves (call before the first save of a run)."""
    scratch = Path(scratch)
    if scratch.is_dir():
        for p in scratch.glob(".tmp-step_*"):
            log.info("removing the unfinished save %s", p)
            shutil.rmtree(p, ignore_errors=True)


def write_manifest(folder: str | Path, names: list[str], data: dict[str, Any] | None = None) -> Path:
    """``folder/manifest.json`` = ``{"files": {name: sha256}}`` of ``names``, written last and
    atomically (the final model folder's seal; :func:`verify_manifest` checks it). ``data``: what the folder
    records of the data it was trained on (meta.json's and tokenizer.json's size and sha256)."""
    folder = Path(folder)
    files = {name: sha256_file(folder / name) for name in sorted(names)}
    manifest: dict[str, Any] = {"format_version": 1, "files": files}
    if data is not None:
        manifest["data"] = data
    write_json_atomic(folder / MANIFEST, manifest)
    return folder / MANIFEST


def _manifest_files(mpath: Path, manifest: Any) -> dict[str, tuple[str, int | None]]:
    """name -> (sha256, bytes or None) of a manifest; an entry naming a path (``../x``, ``a/b``, absolute) or
    without a sha256 is refused: it would escape the folder or go unchecked."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise CheckpointError(f"{mpath} is unreadable: no `files` mapping")
    out = {}
    for name, entry in files.items():
        if not name or name in (".", "..") or "/" in name or "\\" in name or Path(name).is_absolute():
            raise CheckpointError(f"{mpath} lists {name!r}, not a file of {mpath.parent}")
        sha = entry if isinstance(entry, str) else entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
            raise CheckpointError(f"{mpath}: {name} has no sha256, so it is not sealed")
        size = entry.get("bytes") if isinstance(entry, dict) else None
        out[name] = (sha, size if isinstance(size, int) and not isinstance(size, bool) else None)
    return out


def verify_manifest(folder: str | Path, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check every file a folder's manifest lists (entries ``sha256`` or ``{"sha256": ..., "bytes": ...}``);
    return the manifest, or raise CheckpointError naming the file (and both hashes on a mismatch). A manifest
    that does not list every name of ``required``, lists a path outside the folder or an entry without a
    sha256 is refused by name."""
    path = Path(folder)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{mpath} is missing: {path} is incomplete or was not written by mohge.train")
    try:
        manifest = load_json_file(mpath, "manifest")
    except ConfigError as err:
        raise CheckpointError(f"{err}; {path} is incomplete or was changed") from err
    files = _manifest_files(mpath, manifest)
    missing = [f for f in required if f not in files]
    if missing:
        raise CheckpointError(f"{mpath} does not list {missing}: {path} is incomplete or its manifest was edited")
    for name, (expected, nbytes) in files.items():
        fpath = path / name
        if not fpath.is_file():
            raise CheckpointError(f"{fpath} is missing (listed in {MANIFEST})")
        size = fpath.stat().st_size
        actual = sha256_file(fpath) if nbytes is None or size == nbytes else "-"
        if actual != expected:
            want = f", manifest expects {nbytes} bytes" if nbytes is not None else ""
            raise CheckpointError(
                f"{fpath} is corrupted: sha256 {actual} ({size} bytes), manifest expects {expected}{want}"
            )
    return manifest


def verify_checkpoint(path: str | Path, required: tuple[str, ...] = FILES) -> dict[str, Any]:
    """Check a checkpoint folder against its manifest (see :func:`verify_manifest`), which must list ``required``."""
    return verify_manifest(path, required)


def find_latest_valid(scratch: str | Path, required: tuple[str, ...] = FILES) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that passes ``verify_checkpoint`` and the problems of the newer ones skipped
    (each logged as a warning)."""
    problems: list[str] = []
    for _, path in list_checkpoints(scratch):
        try:
            verify_checkpoint(path, required)
        except CheckpointError as err:
            problems.append(str(err))
            log.warning("skipping checkpoint: %s", err)
            continue
        if problems:
            log.warning("falling back to the previous valid checkpoint %s", path)
        return path, problems
    return None, problems


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify and read a checkpoint folder: {"model": state dict, "state": train state, "step", "data" (the data
    position of data.json), "config"}. A sealed file that does not load (a resealed state.pt holding other than
    tensors and plain values, say) is a CheckpointError naming it."""
    path = Path(path)
    verify_checkpoint(path)
    try:
        data = load_json_file(path / "data.json", "checkpoint file")
        config = load_json_file(path / "config.json", "checkpoint file")
    except ConfigError as err:
        raise CheckpointError(str(err)) from err
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        raise CheckpointError(f"{path / 'data.json'}: no step")
    try:
        model = safetensors.torch.load_file(path / "model.safetensors", device=str(map_location))
    except Exception as err:  # safetensors raises its own error types
        raise CheckpointError(f"{path / 'model.safetensors'} does not load: {str(err).splitlines()[0]}") from err
    try:
        state = torch.load(path / "state.pt", map_location=map_location, weights_only=True)
    except Exception as err:  # pickle.UnpicklingError, RuntimeError, ...: never retried with weights_only=False
        raise CheckpointError(
            f"{path / 'state.pt'} does not load as tensors and plain values ({type(err).__name__}); it was not "
            "written by mohge.train"
        ) from err
    return {"model": model, "state": state, "step": data["step"], "data": data, "config": config}


def resolved_config(cfg: RunConfig) -> dict[str, Any]:
    """The run config with every default filled in (what OUT/config.json and checkpoints hold)."""
    d = to_dict(cfg)
    d["data"] = cfg.data_config.to_dict()
    return json.loads(json.dumps(d))


def check_same_run(saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
    """Refuse to resume a checkpoint written by another config (fields that do not change the trajectory,
    such as the checkpoint or log cadence, thread count, device and precision, may differ)."""

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        train = {k: v for k, v in d["train"].items() if k not in RESUMABLE_CHANGES + ("device", "precision")}
        train.setdefault("data_order", "random")  # checkpoints from before the knob read random windows
        return {"model": d["model"], "loss": d["loss"], "data": d["data"], "train": train}

    a, b = strip(saved), strip(now)
    diff = [f"{s}.{k}" for s in a for k in set(a[s]) | set(b[s]) if a[s].get(k) != b[s].get(k)]
    if diff:
        raise ConfigError(f"{where} was written by another config (differs in {sorted(diff)}); use another scratch")


def start_window(data: dict[str, Any] | None, order: str, where: Path | None) -> int:
    """The global window position a run resumed from a checkpoint whose data.json is ``data`` starts at
    (``train.data_order`` sequential; 0 without a checkpoint or in random order). The position is global, not
    per rank, so it carries over to another data-parallel world size."""
    if data is None or order != "sequential":
        return 0
    if data.get("order") != "sequential" or "window" not in data:
        raise CheckpointError(f"{where}/data.json holds no sequential data position: {data}")
    return int(data["window"])


def resume_point(
    scratch: Path, resolved: dict[str, Any], main: bool, world: int, device: torch.device, require: bool
) -> dict[str, Any] | None:
    """The newest checkpoint of ``scratch`` that verifies and loads (``load_checkpoint`` plus its "path"), checked
    against the run's resolved config; a newer one that fails either is skipped with a warning naming the file.
    None when there is none (CheckpointError with ``require``). Under several processes rank 0 chooses and
    broadcasts the folder, so every rank loads the same one."""
    state, problems = None, []
    if main:
        remove_stale_temps(scratch)
        for _, path in list_checkpoints(scratch):
            try:
                state = {**load_checkpoint(path, map_location=device), "path": path}
                break
            except CheckpointError as err:
                problems.append(str(err))
                log.warning("skipping checkpoint: %s", err)
        if state is not None and problems:
            log.warning("falling back to the previous valid checkpoint %s", state["path"])
    found = [str(state["path"]) if state is not None else ""]
    if world > 1:
        torch.distributed.broadcast_object_list(found)
    if found[0]:
        if state is None:
            state = {**load_checkpoint(found[0], map_location=device), "path": Path(found[0])}
        check_same_run(state["config"], resolved, Path(found[0]))
        return state
    if require:
        raise CheckpointError(f"--require-resume: no valid checkpoint in {scratch}")
    if list_checkpoints(scratch):
        log.warning("no valid checkpoint in %s: starting from scratch", scratch)
    return None


def load_trained(path: str | Path, device: str | torch.device = "cpu"):
    """(RunConfig, LanguageModel in eval mode) from a folder with ``model.safetensors`` + ``config.json``
    (the final output of ``mohge.train`` or a ``step_*`` checkpoint)."""
    from mohge.model import LanguageModel

    path = Path(path)
    for name in ("model.safetensors", "config.json"):
        if not (path / name).is_file():
            raise ConfigError(f"{path / name} is missing: not a trained-model folder")
    # a flipped bit fails here, naming the file; a final folder must seal its tokenizer, a checkpoint its state
    verify_manifest(path, FILES if _STEP_DIR.match(path.name) else MODEL_FILES)
    cfg = load_run_config(path / "config.json")
    model = LanguageModel(cfg.model, cfg.loss)
    state = safetensors.torch.load_file(path / "model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{path / 'model.safetensors'}: missing keys {missing}, unexpected keys {unexpected}")
    return cfg, model.to(device).eval()


def trained_tokenizer(folder: str | Path, given: str | Path | None = None) -> Path:
    """The tokenizer.json a model reads with: the folder's own (sealed by its manifest), or ``given`` (a step_*
    checkpoint has none), which must parse and round-trip, and be the folder's own when it has one. Every
    refusal is one line naming the file."""
    from mohge.data.tokenizer import check_tokenizer, tokenizer_probe

    folder = Path(folder)
    own = folder / "tokenizer.json"
    path = Path(given) if given else own
    if not path.is_file():
        raise ConfigError(f"{path} is missing: pass tokenizer=PATH (the data folder's tokenizer.json)")
    # the text it must round-trip is the data source's (a word-level facts tokenizer has no bytes)
    config = folder / "config.json"
    if config.is_file():
        check_tokenizer(path, probe=tokenizer_probe(load_run_config(config).data_config))
    else:
        check_tokenizer(path)
    if given and own.is_file() and sha256_file(path) != sha256_file(own):
        raise ConfigError(
            f"tokenizer={path} is not the tokenizer {own} the model was trained with (sha256 "
            f"{sha256_file(path)[:12]}..., the model's {sha256_file(own)[:12]}...); leave it out to use the model's"
        )
    return path


def check_trained_on(folder: str | Path, cfg: RunConfig, data_dir: str | Path) -> None:
    """Refuse a data folder the model in ``folder`` was not trained on: another data config (meta.json's
    ``config`` against the model's ``data`` section) or another tokenizer (its sealed sha256 against the model
    folder's tokenizer.json), in one line naming both folders."""
    from mohge.config import DataConfig
    from mohge.data.loader import read_meta, sealed_entry

    folder, data_dir = Path(folder), Path(data_dir)
    meta = read_meta(data_dir)
    try:
        have = json.loads(json.dumps(DataConfig.from_dict(meta.get("config") or {}).to_dict()))
    except ValueError as err:
        raise ConfigError(f"{data_dir / 'meta.json'}: its data config does not load ({err})") from err
    want = json.loads(json.dumps(cfg.data_config.to_dict()))
    diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    if diff:
        detail = ", ".join(f"{k}: data {have.get(k)!r}, model {want.get(k)!r}" for k in diff[:4])
        raise ConfigError(
            f"--data {data_dir} was prepared with another data config than the model {folder} was trained on "
            f"({detail}); evaluate on the data folder of its config"
        )
    own = folder / "tokenizer.json"
    if own.is_file():
        _, _, data_sha = sealed_entry(data_dir, meta, "tokenizer.json")
        if (model_sha := sha256_file(own)) != data_sha:
            raise ConfigError(
                f"--data {data_dir}: its tokenizer.json (sha256 {data_sha[:12]}...) is not the tokenizer of the "
                f"model {own} (sha256 {model_sha[:12]}...); evaluate on the data folder the model was trained on"
            )


def write_model(path: str | Path, model_state: dict[str, torch.Tensor]) -> None:
    """Weights alone (the final ``model.safetensors``), written atomically."""
    data = safetensors.torch.save({k: v.detach().cpu().contiguous() for k, v in model_state.items()})
    write_bytes_atomic(path, data)


__all__ = [
    "CheckpointError",
    "capture_rng",
    "check_trained_on",
    "find_latest_valid",
    "list_checkpoints",
    "load_checkpoint",
    "load_trained",
    "prune_checkpoints",
    "remove_stale_temps",
    "restore_rng",
    "save_checkpoint",
    "trained_tokenizer",
    "verify_checkpoint",
    "verify_manifest",
    "write_manifest",
    "write_model",
]
