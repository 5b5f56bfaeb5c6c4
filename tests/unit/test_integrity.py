"""What is checked once is checked on every path that reads a file.

Each test is one way a file can be changed under the code, refused by name (or resumed exactly):
1 a shard rewritten in place (same size) before a resume; 2 a tokenizer.json with two merges swapped;
3 evaluation on a data folder of another tokenizer or data config; 4 an edited test_docs.jsonl;
9 refusals in one line naming the file or key; 10 seals bypassed by deleting or redirecting entries.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import tiny_run

from mohge.config import ConfigError, DataConfig, RunConfig
from mohge.core.cli import describe_os_error
from mohge.data import TokenStream, prepare
from mohge.data.loader import verify_folder
from mohge.train import checkpoint as ckpt
from mohge.train.trainer import train

DATA = {"source": "graded", "vocab_size": 300, "seq_len": 16, "graded_num_docs": 120}
RUN = tiny_run(data=DATA, train={"steps": 4, "ckpt_every": 2, "keep_checkpoints": 3})


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    """A prepared folder and a model trained on it (4 steps, checkpoints at 2 and 4)."""
    root = tmp_path_factory.mktemp("integrity")
    prepare(DataConfig.from_dict(DATA), root / "data")
    n = torch.get_num_threads()
    train(RunConfig.from_dict(RUN), root / "model", data=str(root / "data"))
    torch.set_num_threads(n)
    return {"data": root / "data", "model": root / "model"}


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".mohge.lock*"))
    return dst


def rewrite_same_size(path: Path) -> None:
    """Change the bytes of ``path`` in place, keeping its size (and putting its mtime back)."""
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0x01
    with open(path, "r+b") as fh:
        fh.write(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


class Payload:
    """What weights_only loading refuses: a pickled object of an arbitrary class."""


def meta_of(data: Path) -> dict:
    return json.loads((data / "meta.json").read_text())


def write_meta(data: Path, meta: dict) -> None:
    (data / "meta.json").write_text(json.dumps(meta, indent=2))


def swap_two_merges(path: Path) -> None:
    """A valid, round-tripping tokenizer.json that encodes differently: its first two merges swapped."""
    tok = json.loads(path.read_text())
    merges = tok["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]
    path.write_text(json.dumps(tok))


# ---------------------------------------------------------------- item 1: a resume re-verifies


def test_a_shard_rewritten_in_place_is_refused_on_resume(base, tmp_path):
    data = copy(base["data"], tmp_path / "data")
    out = tmp_path / "out"
    cfg = RunConfig.from_dict(tiny_run(data=DATA, train={"steps": 2, "ckpt_every": 2}))
    train(cfg, out, data=str(data))
    marker = out / ".scratch" / "data_verified.json"
    record = json.loads(marker.read_text())
    shard = meta_of(data)["shards"]["train"][0]["file"]
    assert set(record["files"][shard]) == {"bytes", "mtime_ns", "ctime_ns", "sha256"}
    rewrite_same_size(data / shard)  # same size, mtime put back: the ctime still moves
    with pytest.raises(ConfigError, match=rf"{shard} was changed or truncated: sha256 .* meta.json expects"):
        train(cfg, out, data=str(data))  # the resume hashes the changed file again
    verify_folder(base["data"], tmp_path / "unchanged.json")  # a fresh record of the untouched folder passes


def test_the_verification_record_rehashes_only_what_changed(base, tmp_path, monkeypatch):
    from mohge.data import loader

    data = copy(base["data"], tmp_path / "data")
    marker = tmp_path / "verified.json"
    verify_folder(data, marker, required=("tokenizer.json",))
    hashed = []
    real = loader._sha256
    monkeypatch.setattr(loader, "_sha256", lambda p, bar: hashed.append(p.name) or real(p, bar))
    verify_folder(data, marker, required=("tokenizer.json",))
    assert hashed == []  # nothing changed: nothing hashed
    (data / "tokenizer.json").touch()
    verify_folder(data, marker, required=("tokenizer.json",))
    assert hashed == ["tokenizer.json"]


# ---------------------------------------------------------------- item 2: the tokenizer where it is used


def test_a_tokenizer_with_two_merges_swapped_is_refused_by_training(base, tmp_path):
    data = copy(base["data"], tmp_path / "data")
    swap_two_merges(data / "tokenizer.json")
    with pytest.raises(ConfigError, match=r"data/tokenizer\.json was changed or truncated"):
        train(RunConfig.from_dict(RUN), tmp_path / "out", data=str(data))
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_a_swapped_tokenizer_is_refused_by_the_model_readers(base, tmp_path):
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    model = copy(base["model"], tmp_path / "model")
    other = tmp_path / "other.json"
    shutil.copy(model / "tokenizer.json", other)
    swap_two_merges(other)
    with pytest.raises(ConfigError, match=r"tokenizer=.*other\.json is not the tokenizer .*model/tokenizer\.json"):
        MoHGELM(str(model), device="cpu", tokenizer=str(other))
    swap_two_merges(model / "tokenizer.json")  # in the sealed folder itself: its manifest names it
    with pytest.raises(ckpt.CheckpointError, match=r"model/tokenizer\.json is corrupted"):
        MoHGELM(str(model), device="cpu")


# ---------------------------------------------------------------- item 3: data the model was not trained on


def test_evaluation_and_tracing_refuse_another_tokenizer_or_data_config(base, tmp_path):
    from mohge.evaluate.traces import trace_checkpoint

    other_cfg = tmp_path / "reseeded"
    prepare(DataConfig.from_dict({**DATA, "seed": 1}), other_cfg)
    with pytest.raises(ConfigError, match=r"--data .*reseeded was prepared with another data config than the model"):
        trace_checkpoint(base["model"], other_cfg, tmp_path / "t.json")
    # the same data config with another tokenizer (resealed, so only the comparison can tell)
    other_tok = copy(base["data"], tmp_path / "retok")
    swap_two_merges(other_tok / "tokenizer.json")
    meta = meta_of(other_tok)
    meta["files"]["tokenizer.json"]["sha256"] = ckpt.sha256_file(other_tok / "tokenizer.json")
    meta["files"]["tokenizer.json"]["bytes"] = (other_tok / "tokenizer.json").stat().st_size
    write_meta(other_tok, meta)
    message = r"--data .*retok: its tokenizer\.json \(sha256 \w+\.\.\.\) is not the tokenizer of the model .*model"
    with pytest.raises(ConfigError, match=message):
        trace_checkpoint(base["model"], other_tok, tmp_path / "t.json")
    cfg, _ = ckpt.load_trained(base["model"])
    with pytest.raises(ConfigError, match=message):
        ckpt.check_trained_on(base["model"], cfg, other_tok)
    ckpt.check_trained_on(base["model"], cfg, base["data"])  # its own data passes


# ---------------------------------------------------------------- item 4: held-out documents are sealed


def test_an_edited_test_docs_file_is_refused_by_the_task_builder(base, tmp_path):
    from mohge.evaluate.suite import build_tasks

    data = copy(base["data"], tmp_path / "data")
    meta = meta_of(data)
    assert {"tokenizer.json", "val.txt", "val_docs.jsonl", "test.txt", "test_docs.jsonl"} <= set(meta["files"])
    assert build_tasks(data, tmp_path / "ok", max_length=10**6)
    rewrite_same_size(data / "test_docs.jsonl")
    with pytest.raises(ConfigError, match=r"test_docs\.jsonl was changed or truncated: sha256"):
        build_tasks(data, tmp_path / "tasks", max_length=10**6)
    del meta["files"]["test_docs.jsonl"]
    write_meta(data, meta)
    with pytest.raises(ConfigError, match=r"meta\.json does not list test_docs\.jsonl"):
        build_tasks(data, tmp_path / "tasks", max_length=10**6)


# ---------------------------------------------------------------- item 10: seals that cannot be bypassed


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e: e.pop("sha256"), r"shards\.train\[0\]\.sha256=None: no sha256, so the file is not sealed"),
        (lambda e: e.update(file="../outside.bin"), r"shards\.train\[0\]\.file='\.\./outside\.bin': not a file inside"),
        (lambda e: e.update(file="/etc/passwd"), r"shards\.train\[0\]\.file='/etc/passwd': not a file inside"),
    ],
)
def test_a_shard_entry_without_hash_or_outside_the_folder_is_refused(base, tmp_path, edit, message):
    data = copy(base["data"], tmp_path / "data")
    meta = meta_of(data)
    edit(meta["shards"]["train"][0])
    write_meta(data, meta)
    with pytest.raises(ConfigError, match=message):
        TokenStream.open(data, "train")
    with pytest.raises(ConfigError, match=message):
        verify_folder(data, tmp_path / "v.json")


def test_a_model_manifest_without_the_tokenizer_or_with_a_bad_entry_is_refused(base, tmp_path):
    model = copy(base["model"], tmp_path / "model")
    manifest = json.loads((model / "manifest.json").read_text())
    assert manifest["data"]["tokenizer.json"]["sha256"] == ckpt.sha256_file(model / "tokenizer.json")
    cases = {
        "drop": ({k: v for k, v in manifest["files"].items() if k != "tokenizer.json"}, r"does not list \['tokenizer"),
        "escape": ({**manifest["files"], "../x": manifest["files"]["config.json"]}, r"lists '\.\./x', not a file of"),
        "unhashed": ({**manifest["files"], "tokenizer.json": {"bytes": 1}}, r"tokenizer\.json has no sha256"),
    }
    for files, message in cases.values():
        (model / "manifest.json").write_text(json.dumps({**manifest, "files": files}))
        with pytest.raises(ckpt.CheckpointError, match=message):
            ckpt.load_trained(model)


# ---------------------------------------------------------------- item 9: one line naming the file or key


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_5000_deep_config_is_refused_in_one_line(tmp_path, suffix, caplog):
    from mohge_studies.config.runs import main

    path = tmp_path / f"deep{suffix}"
    nested = "[" * 5000 + "]" * 5000
    path.write_text('{"a": ' + nested + "}" if suffix == ".json" else "a: " + nested)
    assert main(["list", str(path)]) == 2
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert re.search(rf"deep{suffix}(:\d+:\d+)?: nested deeper than 64 levels$", lines[0]), lines[0]


def test_a_truncated_meta_json_is_named(base, tmp_path):
    data = copy(base["data"], tmp_path / "data")
    text = (data / "meta.json").read_text()
    (data / "meta.json").write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match=r"data/meta\.json:\d+:\d+: not valid JSON"):
        TokenStream.open(data, "val")


def test_a_resealed_state_pt_that_is_not_weights_falls_back_to_the_previous_checkpoint(base, tmp_path, caplog):
    scratch = copy(base["model"] / ".scratch", tmp_path / "scratch")
    newest = scratch / "step_00000004"
    (newest / "state.pt").write_bytes(pickle.dumps(Payload()))
    manifest = json.loads((newest / "manifest.json").read_text())
    raw = (newest / "state.pt").read_bytes()
    manifest["files"]["state.pt"] = {"sha256": ckpt.sha256_bytes(raw), "bytes": len(raw)}
    (newest / "manifest.json").write_text(json.dumps(manifest))  # resealed: the hash alone cannot tell
    with pytest.raises(ckpt.CheckpointError, match=r"step_00000004/state\.pt does not load as tensors"):
        ckpt.load_checkpoint(newest)
    resolved = json.loads((base["model"] / "config.json").read_text())
    state = ckpt.resume_point(scratch, resolved, True, 1, torch.device("cpu"), True)
    assert state["step"] == 2 and state["path"].name == "step_00000002"
    assert "state.pt does not load" in caplog.text and "weights_only=False" not in caplog.text


def test_model_args_tokenizer_that_is_not_a_tokenizer_is_named(base, tmp_path):
    from mohge.evaluate.lm_eval_adapter import MoHGELM

    bad = tmp_path / "not-a-tokenizer.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match=r"not-a-tokenizer\.json: not a usable tokenizer"):
        MoHGELM(str(base["model"]), device="cpu", tokenizer=str(bad))


def test_scratch_equal_to_out_is_refused_naming_both(base, tmp_path):
    with pytest.raises(ConfigError, match=r"--scratch .*o is --out: the checkpoints need a folder of their own"):
        train(RunConfig.from_dict(RUN), tmp_path / "o", scratch=tmp_path / "o", data=str(base["data"]))


def test_an_enospc_names_the_file_being_written(tmp_path, monkeypatch):
    from mohge.core import atomic

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write(2) reports it: no file name

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError) as err:
        atomic.write_bytes_atomic(tmp_path / "state.pt", b"x")
    assert describe_os_error(err.value).startswith("No space left on device (ENOSPC): ")
    assert ".state.pt." in err.value.filename and str(tmp_path) in err.value.filename
    monkeypatch.undo()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(OSError) as err:
        atomic.append_line(tmp_path / "log.jsonl", "{}")
    assert err.value.filename == str(tmp_path / "log.jsonl")


# ---------------------------------------------------------------- a held-out split shorter than one window


@pytest.mark.parametrize("split", ["val", "test"])
def test_a_held_out_split_shorter_than_one_window_is_refused_at_train_start(base, tmp_path, split):
    data = copy(base["data"], tmp_path / "data")
    meta = meta_of(data)
    S = meta["tokens"][split]
    assert meta["tokens"]["test"] < meta["tokens"]["val"]  # so a seq_len can fit val and not test
    run = tiny_run(data={**DATA, "seq_len": S}, model={"max_seq_len": S}, train={"steps": 2})
    meta["config"] = DataConfig.from_dict(run["data"]).to_dict()
    write_meta(data, meta)
    with pytest.raises(ConfigError, match=rf"data\.seq_len={S}: the {split} split of .* holds {S} tokens, fewer than"):
        train(RunConfig.from_dict(run), tmp_path / "out", data=str(data))


# ---------------------------------------------------------------- item 6: committed results are not overwritten


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_an_out_holding_committed_files_of_another_run_is_refused(base, tmp_path):
    from mohge.config import preflight, to_dict

    repo = tmp_path / "repo"
    run_dir = repo / "results" / "x" / "runs" / "r"
    run_dir.mkdir(parents=True)
    recorded = RunConfig.from_dict(tiny_run(data=DATA, train={"steps": 3}))  # the run the folder records
    (run_dir / "config.json").write_text(json.dumps(to_dict(recorded)))
    (run_dir / "summary.json").write_text("{}\n")
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "committed results", cwd=repo)
    with pytest.raises(ConfigError, match=r"--out .*runs/r holds 2 committed file\(s\) \(results/x/runs/r/"):
        train(RunConfig.from_dict(RUN), run_dir, data=str(base["data"]))
    with pytest.raises(ConfigError, match=r"--scratch .*runs/r holds 2 committed file"):
        train(RunConfig.from_dict(RUN), tmp_path / "elsewhere", scratch=run_dir, data=str(base["data"]))
    assert git("status", "--porcelain", "--untracked-files=all", cwd=repo) == ""
    preflight.check_not_committed(run_dir, "--out", recorded)  # its own run may write it again
    preflight.check_not_committed(repo / "results" / "y", "--out", recorded)  # no committed file there


def test_plan_refuses_a_shared_structure_before_walking_it():
    """What a YAML alias in a `snakemake --config` value parses to: nine levels of nine references."""
    from mohge_studies.config.runs import plan

    tasks: list = ["x"] * 9
    for _ in range(8):
        tasks = [tasks] * 9
    with pytest.raises(ConfigError, match=r"^config: more than 200000 values once its aliases are expanded"):
        plan({"eval": {"tasks": tasks}})
