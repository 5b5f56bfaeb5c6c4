"""Preparation: documents -> byte-level BPE (train split only) -> token files + meta.json; the CLI.

Files written by `prepare(cfg, out_dir)` are listed in the package docstring (mohge.data).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from mohge.atomic import write_bytes_atomic, write_text_atomic
from mohge.cli import user_errors
from mohge.config import SPLITS, DataConfig, load_yaml_or_json
from mohge.data.sources import Doc, build_docs, default_cache_dir
from mohge.graded import LEVEL_NAMES, LEVEL_SEP, token_levels
from mohge.tokenizer import EOT_ID, encode_with_offsets, load_tokenizer, train_tokenizer

log = logging.getLogger("mohge.data")
MAX_META_DOC_NAMES = 10_000  # meta.json lists document names per split up to this many (else null)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size < 2**16 else np.dtype(np.uint32)


def _encode_docs(tok, docs: Sequence[Doc], dtype: np.dtype, desc: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Concatenate the documents' ids, each followed by EOT; with char levels, also the token levels."""
    with_levels = bool(docs) and docs[0].levels is not None
    ids_parts, level_parts = [], []
    eot = np.array([EOT_ID], dtype=dtype)
    with tqdm(total=sum(len(d.text) for d in docs), unit="char", unit_scale=True, desc=desc, disable=None) as bar:
        for doc in docs:
            ids, offsets = encode_with_offsets(tok, doc.text)
            ids_parts += [np.asarray(ids, dtype=dtype), eot]
            if with_levels:
                assert doc.levels is not None and len(doc.levels) == len(doc.text)
                level_parts += [token_levels(offsets, doc.levels), np.array([LEVEL_SEP], dtype=np.int8)]
            bar.update(len(doc.text))
    ids_all = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=dtype)
    levels_all = None
    if with_levels:
        levels_all = np.concatenate(level_parts)
        assert len(levels_all) == len(ids_all)
    return ids_all, levels_all


def _doc_record(cfg: DataConfig, doc: Doc) -> dict[str, Any]:
    key = {"shakespeare": "play", "text": "file", "hf": "id", "graded": "id"}[cfg.source]
    rec: dict[str, Any] = {key: doc.name, "text": doc.text}
    if doc.levels is not None:
        rec["levels"] = doc.levels
    return rec


def prepare(cfg: DataConfig, out_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Build the token files of `cfg` in `out_dir` (see the module docstring) and return the meta dict.

    The tokenizer sees the train split only. `cache_dir` keeps downloads (default: `default_cache_dir()`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").unlink(missing_ok=True)  # the completion marker goes first and comes back last
    docs = build_docs(cfg, cache_dir)
    for s in SPLITS:
        log.info("%s: %d documents, %d chars", s, len(docs[s]), sum(len(d.text) for d in docs[s]))
    if not docs["train"]:
        raise ValueError(f"data.source={cfg.source!r}: the train split is empty")

    log.info("training byte-level BPE (vocab_size=%d) on the train split", cfg.vocab_size)
    train_tokenizer((d.text for d in docs["train"]), cfg.vocab_size, out / "tokenizer.json")
    tok = load_tokenizer(out / "tokenizer.json")
    dtype = token_dtype(cfg.vocab_size)

    meta: dict[str, Any] = {
        "format_version": 1,
        "source": cfg.source,
        "config": cfg.to_dict(),
        "tokenizer": "tokenizer.json",
        "vocab_size": tok.get_vocab_size(),
        "vocab_size_requested": cfg.vocab_size,
        "eot_id": EOT_ID,
        "dtype": dtype.name,
        "tokens": {},
        "chars": {s: sum(len(d.text) for d in docs[s]) for s in SPLITS},
        "num_docs": {s: len(docs[s]) for s in SPLITS},
        "docs": {s: [d.name for d in docs[s]] if len(docs[s]) <= MAX_META_DOC_NAMES else None for s in SPLITS},
        "files": {},
        "sha256": {},
    }
    if cfg.source == "shakespeare":
        meta["archive_sha256"] = cfg.shakespeare_sha256
    for s in SPLITS:
        ids, levels = _encode_docs(tok, docs[s], dtype, desc=f"encode {s}")
        meta["tokens"][s] = int(len(ids))
        arrays = {f"{s}.bin": ids} if levels is None else {f"{s}.bin": ids, f"{s}.levels.bin": levels}
        for name, arr in arrays.items():
            payload = arr.tobytes()
            write_bytes_atomic(out / name, payload)
            meta["sha256"][name] = hashlib.sha256(payload).hexdigest()
        meta["files"][s] = sorted(arrays)
        if len(ids) <= cfg.seq_len:
            log.warning("%s split has %d tokens, not more than seq_len=%d", s, len(ids), cfg.seq_len)
    if cfg.source == "graded":
        meta["levels"] = {
            "dtype": "int8",
            "names": {str(LEVEL_SEP): "separator", **{str(i): n for i, n in enumerate(LEVEL_NAMES)}},
            "token_rule": "max over the token's characters",
        }
    for s in ("val", "test"):
        write_text_atomic(out / f"{s}.txt", "\n\n".join(d.text for d in docs[s]))
        lines = [json.dumps(_doc_record(cfg, d), ensure_ascii=False) + "\n" for d in docs[s]]
        write_text_atomic(out / f"{s}_docs.jsonl", "".join(lines))
    write_text_atomic(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    log.info("wrote %s: tokens %s", out, meta["tokens"])
    return meta


def load_meta(data_dir: str | os.PathLike) -> dict[str, Any]:
    """meta.json of a prepared folder; a folder without it was not (completely) prepared."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m mohge.data` for {data_dir} first")
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------


def load_data_config(path: str | os.PathLike) -> DataConfig:
    """DataConfig from a JSON (or YAML) file holding either a `data` section or the DataConfig itself."""
    d = load_yaml_or_json(path)
    if isinstance(d.get("data"), Mapping):
        d = d["data"]
    return DataConfig.from_dict(d)


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mohge.data",
        description="Prepare a data source into tokenizer.json, {train,val,test}.bin and meta.json. "
        "The tokenizer is trained on the train split only; Shakespeare is split by whole plays.",
        epilog="Example: python -m mohge.data --config results/run/config.json --out data/shakespeare",
    )
    keys = ", ".join(f.name for f in dataclasses.fields(DataConfig))
    parser.add_argument(
        "--config",
        required=True,
        help=f"JSON/YAML file: a run config with a `data` section, or a DataConfig mapping (keys: {keys})",
    )
    parser.add_argument("--out", required=True, help="output folder (created; its meta.json marks completion)")
    parser.add_argument("--cache-dir", default=None, help=f"download cache (default {default_cache_dir()})")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    meta = prepare(load_data_config(args.config), args.out, args.cache_dir)
    print(json.dumps({"out": str(args.out), "vocab_size": meta["vocab_size"], "tokens": meta["tokens"]}))
    return 0
