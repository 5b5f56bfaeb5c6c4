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
