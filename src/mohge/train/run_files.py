"""What the training loop needs before its first step and after its last: the run's data folder, its checks, and
the final outputs beside the weights (config.json, tokenizer.json, the summary: :func:`finish`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mohge.config import ConfigError, RunConfig
from mohge.config.provenance import code_version
from mohge.config.sizes import count_params
from mohge.core.atomic import sha256_file, write_bytes_atomic, write_json_atomic
from mohge.core.knobs import to_dict
from mohge.data import load_meta, prepare
from mohge.data.loader import sealed_entry, verify_folder
from mohge.data.tokenizer import check_tokenizer, eot_id, tokenizer_probe

from . import checkpoint as ckpt
from .runtime import Runtime

log = logging.getLogger("mohge.train")

# The final output folder; manifest.json (sha256 of each) is written after all of them.
FINAL_FILES = ("model.safetensors", "config.json", "tokenizer.json", "train_log.jsonl", "summary.json")


def resolve_data(cfg: RunConfig, data_arg: str | None, scratch: Path, rt: Runtime) -> Path:
    """The prepared data folder: ``--data`` or, without it, SCRATCH/data prepared from the config."""
    want = json.loads(json.dumps(cfg.data_config.to_dict()))
    if data_arg is not None:
        data_dir = Path(data_arg)
    else:
        data_dir = scratch / "data"
        try:
            fresh = (data_dir / "meta.json").is_file() and load_meta(data_dir).get("config") == want
        except ValueError:  # a truncated or older meta.json in the scratch copy: prepared again
            fresh = False
        if rt.main and not fresh:
            log.info("preparing the data of the config into %s", data_dir)
            prepare(cfg.data_config, data_dir)
        rt.barrier()
    meta = load_meta(data_dir)
    have = meta.get("config", {})
    diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if diff:
        detail = ", ".join(f"{k}: prepared {have.get(k)!r}, config {want.get(k)!r}" for k in diff[:5])
        raise ConfigError(f"data folder {data_dir} was prepared with another data config ({detail})")
    if meta["vocab_size"] > cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} < the tokenizer's {meta['vocab_size']}")
    return data_dir


def check_data(cfg: RunConfig, data_dir: Path, scratch: Path) -> None:
    """Before the first step (rank 0), on every start and resume: every token file and tokenizer.json match
    meta.json (hashed again where size, mtime or ctime changed; SCRATCH/data_verified.json), the tokenizer parses,
    round-trips and gives data.eot_token the id the shards hold, and the val and test splits hold one window each."""
    verify_folder(data_dir, scratch / "data_verified.json", required=("tokenizer.json",))
    eot_token = cfg.data_config.eot_token
    tok = check_tokenizer(data_dir / "tokenizer.json", eot_token, tokenizer_probe(cfg.data_config))
    # The model folder gets this tokenizer.json and data.eot_token, from which evaluation and the HF export
    # take the end-of-text id: it must be the id the shards hold (meta["eot_id"]).
    meta = load_meta(data_dir)
    if (have := meta["eot_id"]) != eot_id(tok, eot_token):
        raise ConfigError(
            f"{data_dir / 'meta.json'}: eot_id={have}, but its tokenizer.json gives data.eot_token={eot_token!r} "
            f"the id {eot_id(tok, eot_token)}; prepare the data again"
        )
    S = cfg.data_config.seq_len
    for split in ("val", "test"):  # a held-out loss would cover a fraction of one window (summary, metrics.json)
        if (have := meta["tokens"][split]) < S + 1:
            raise ConfigError(
                f"data.seq_len={S}: the {split} split of {data_dir} holds {have} tokens, fewer than one window of "
                f"seq_len + 1 = {S + 1}; hold out more (data.{split}_tokens, {split} documents) or shorten "
                "data.seq_len"
            )


def data_seal(data_dir: Path) -> dict[str, Any]:
    """What the model folder's manifest records of its data: meta.json's and tokenizer.json's size and sha256."""
    meta_path = data_dir / "meta.json"
    _, size, sha = sealed_entry(data_dir, load_meta(data_dir), "tokenizer.json")
    return {
        "meta.json": {"bytes": meta_path.stat().st_size, "sha256": sha256_file(meta_path)},
        "tokenizer.json": {"bytes": size, "sha256": sha},
    }


@dataclass(frozen=True)
class TrainResult:
    """What the training loop hands to :func:`finish`: the run, where it ran, its log rows and how far it came."""

    cfg: RunConfig
    rt: Runtime
    data_dir: Path
    rows: list[dict[str, Any]]  # the whole log, the rows before a resume included
    resumed_from_step: int
    trained_tokens: int  # tokens of the steps this process ran (all ranks)
    train_time: float  # seconds in those steps
    val: dict[str, float]  # the final held-out loss (mohge.train.heldout.heldout_loss)


def finish(out: Path, result: TrainResult) -> dict[str, Any]:
    """Write OUT/{config.json, tokenizer.json} (the tokenizer only while it is still the one meta.json seals);
    return the run's summary. The weights and the log are the training loop's to write."""
    cfg, rt, data_dir = result.cfg, result.rt, Path(result.data_dir)
    tc = cfg.train
    write_json_atomic(out / "config.json", ckpt.resolved_config(cfg))
    tok_bytes = (data_dir / "tokenizer.json").read_bytes()
    _, _, tok_sha = sealed_entry(data_dir, load_meta(data_dir), "tokenizer.json")
    if ckpt.sha256_bytes(tok_bytes) != tok_sha:  # changed since the start: never sealed into the model folder
        raise ConfigError(f"{data_dir / 'tokenizer.json'} changed during training (sha256 differs from meta.json's)")
    write_bytes_atomic(out / "tokenizer.json", tok_bytes)
    last = next((r for r in reversed(result.rows) if "loss" in r), {})
    params = count_params(cfg.model)
    return {
        "name": cfg.name,
        "family": cfg.family,
        "steps": tc.steps,
        "resumed_from_step": result.resumed_from_step,
        "tokens_trained": tc.steps * tc.batch_size * cfg.data_config.seq_len * rt.world,
        "final_train_loss": last.get("loss"),
        "final_lm_loss": last.get("lm_loss"),
        "val_loss": result.val["loss"],
        "val_ppl": result.val["ppl"],
        "val_tokens": result.val["tokens"],
        "tokens_per_s": result.trained_tokens / result.train_time if result.train_time > 0 else None,
        "device": str(rt.device),
        "world_size": rt.world,
        "precision": "bf16" if rt.autocast is not None else "fp32",
        "precision_reason": rt.precision_reason,
        "cpu_bf16": rt.cpu_bf16,
        "params_total": params["total_sum"],
        "params_activated": params["activated_sum"],
        "params_total_non_embedding": params["total_non_embedding"],
        "params_activated_non_embedding": params["activated_non_embedding"],
        # which code made it, from which config (mohge.config.provenance): the training config, without eval
        "code": code_version({k: v for k, v in to_dict(cfg).items() if k != "eval"}),
    }
