"""Support of the loader tests: a prepared folder of format version 2 (many shards per split), built from a
format-1 folder of ``prepare`` by cutting each split's token stream at document ends (EOT), as the data contract
lays it out (D/shards/{split}-{i:05d}.bin, meta["shards"][split] with tokens, docs and sha256 per shard)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from mohge.config import SPLITS
from mohge.data import TokenStream
from mohge.data.tokenizer import EOT_ID


def _cuts(ids: np.ndarray, num_shards: int) -> list[int]:
    """Shard ends: the EOT closest above each 1/num_shards of the stream (documents never straddle shards)."""
    ends = np.flatnonzero(ids == EOT_ID) + 1
    cuts = (
        sorted(
            {
                int(ends[min(np.searchsorted(ends, len(ids) * k // num_shards), len(ends) - 1)])
                for k in range(1, num_shards)
            }
            | {len(ids)}
        )
        if len(ends)
        else [len(ids)]
    )
    return cuts


def reshard(src: Path, out: Path, num_shards: int) -> dict:
    """Write ``out`` with the tokens of the prepared folder ``src`` cut into up to ``num_shards`` shards per split
    (cut after an EOT, so documents never straddle shards); returns its meta."""
    meta = json.loads((src / "meta.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "shards").mkdir(exist_ok=True)
    for name in ("tokenizer.json", "val.txt", "test.txt", "val_docs.jsonl", "test_docs.jsonl"):
        shutil.copy(src / name, out / name)
    dtype = np.dtype(meta["dtype"])
    new = {k: v for k, v in meta.items() if k not in ("sha256", "shards")}  # files: the copies above, same bytes
    new["format_version"], new["shards"] = 2, {}
    for s in SPLITS:
        stream = TokenStream.open(src, s)
        ids = np.asarray(stream.tokens, dtype=dtype)
        levels = None if stream.levels is None else np.asarray(stream.levels, dtype=np.int8)
        entries, lo = [], 0
        for i, hi in enumerate(_cuts(ids, num_shards)):
            rel = f"shards/{s}-{i:05d}.bin"
            payload = ids[lo:hi].tobytes()
            (out / rel).write_bytes(payload)
            entry = {"file": rel, "tokens": hi - lo, "docs": int((ids[lo:hi] == EOT_ID).sum()), "levels": None}
            entry["sha256"] = hashlib.sha256(payload).hexdigest()
            if levels is not None:
                lrel = f"shards/{s}-{i:05d}.levels.bin"
                lpay = levels[lo:hi].tobytes()
                (out / lrel).write_bytes(lpay)
                entry["levels"] = {"file": lrel, "sha256": hashlib.sha256(lpay).hexdigest()}
            entries.append(entry)
            lo = hi
        new["shards"][s] = entries
    (out / "meta.json").write_text(json.dumps(new, indent=2) + "\n")
    return new


def write_shards(out: Path, shards: dict[str, list[np.ndarray]], dtype: str = "uint16") -> dict:
    """A minimal format-2 folder holding the given token arrays as the shards of each split (no tokenizer)."""
    meta: dict = {"format_version": 2, "dtype": dtype, "tokens": {}, "shards": {}}
    (out / "shards").mkdir(parents=True, exist_ok=True)
    for s, arrays in shards.items():
        entries = []
        for i, arr in enumerate(arrays):
            payload = np.asarray(arr, dtype=dtype).tobytes()
            rel = f"shards/{s}-{i:05d}.bin"
            (out / rel).write_bytes(payload)
            sha = hashlib.sha256(payload).hexdigest()
            entries.append({"file": rel, "tokens": len(arr), "docs": 1, "sha256": sha, "levels": None})
        meta["shards"][s], meta["tokens"][s] = entries, sum(len(a) for a in arrays)
    (out / "meta.json").write_text(json.dumps(meta))
    return meta
