"""The sharded data preparation in the workflow's plan: a tokenizer job, data.num_shards shard jobs, a gather job;
fineweb-edu (paper.yaml) asked only for the split it publishes."""

from __future__ import annotations

import re

import yaml
from test_workflow import ROOT, copy_workflow, smk


def job_counts(text: str) -> dict[str, int]:
    """The dry run's "Job stats" table: rule -> count."""
    table = text[text.index("Job stats:") :].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def test_paper_plans_sharded_preparation_without_a_missing_split(tmp_path):
    work = copy_workflow(tmp_path)
    out = smk("-n", "--configfile", "configs/paper.yaml", cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    data = yaml.safe_load((ROOT / "configs" / "paper.yaml").read_text())["datasets"]["web"]
    counts = job_counts(text)
    assert data["num_shards"] > 1
    assert counts["data_tokenizer"] == 1 and counts["prepare_data"] == 1
    assert counts["data_shard"] == data["num_shards"]
    assert data["hf_splits"] == {"train": "train"}  # fineweb-edu publishes only train: val/test by hash
    assert data["val_tokens"] == data["test_tokens"] == 50_000_000  # held out by token count (§12.2)
    assert "validation" not in text
    shard_outputs = sorted(set(re.findall(r"work/paper/data/web/shards/part-(\d{5})\.json", text)))
    assert shard_outputs == [f"{i:05d}" for i in range(data["num_shards"])]


def test_num_shards_sets_the_number_of_shard_jobs(tmp_path):
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs" / "smoke.yaml").read_text())
    for section in cfg["datasets"].values():
        section["num_shards"] = 3
    (work / "sharded.yaml").write_text(yaml.safe_dump(cfg))
    out = smk("-n", "--configfile", "sharded.yaml", cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    counts = job_counts(out.stdout + out.stderr)
    assert counts["data_shard"] == 3 * len(cfg["datasets"]) and counts["data_tokenizer"] == len(cfg["datasets"])
    assert not (work / "work").exists()  # a dry run writes nothing


def test_data_rules_hold_out_by_token_count(tmp_path):
    """The three data rules run for an hf corpus held out by tokens: the shard jobs declare only their train
    shard (they write candidates, not val/test), and the gather writes val/test and meta.json."""
    import json

    work = copy_workflow(tmp_path)
    corpus = work / "corpus"
    corpus.mkdir()
    for f in range(3):
        rows = [{"text": f"file {f} row {k}: " + "words and more words " * (1 + (f * 7 + k) % 9)} for k in range(30)]
        (corpus / f"part-{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load((work / "configs" / "smoke.yaml").read_text())
    (name,) = cfg["datasets"]  # the smoke runs' dataset, replaced (the plan knows only the runs' datasets)
    cfg["datasets"][name] = {
        "source": "hf",
        "hf_name": "json",
        "hf_data_files": ["corpus/*.jsonl"],
        "hf_splits": {"train": "train"},
        "val_tokens": 200,
        "test_tokens": 100,
        "holdout_candidate_fraction": 0.5,
        "vocab_size": 300,
        "seq_len": 16,
        "num_shards": 3,
    }
    (work / "tokens.yaml").write_text(yaml.safe_dump(cfg))
    out = smk("--configfile", "tokens.yaml", "--cores", "1", f"work/{cfg['study']}/data/{name}/meta.json", cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    assert job_counts(out.stdout + out.stderr)["data_shard"] == 3
    meta = json.loads((work / "work" / cfg["study"] / "data" / name / "meta.json").read_text())
    assert meta["split"]["method"] == "doc_hash_tokens"
    assert meta["tokens"]["val"] >= 200 and meta["tokens"]["test"] >= 100
    assert [e["file"] for e in meta["shards"]["val"]] == ["shards/val-00000.bin"]
    assert len(meta["shards"]["train"]) == 4
