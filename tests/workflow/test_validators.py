"""One validator for the workflow and `mohge runs list`, bounded config loading
before any expansion, and committed results that no other config can overwrite.

The same config files go to both: they must refuse with the same one-line message (or both accept)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_workflow import copy_workflow, smk


def runs_list(work: Path, *files: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mohge", "runs", "list", "configs/config.yaml", *files]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=120)


def refusal(text: str, prefix: str, work: Path) -> str:
    """The one refusal line after ``prefix`` (paths made relative to the working copy)."""
    lines = [line for line in text.splitlines() if prefix in line]
    assert len(lines) == 1, text[-3000:]
    return lines[0].split(prefix, 1)[1].replace(f"{work}/", "").strip()


def alias_bomb() -> str:
    """515 bytes or so that expand to 9**9 task names: every level lists the one above nine times."""
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join(f'*{prev}' for _ in range(9))}]")
    return "\n".join(lines) + "\neval: {tasks: *i}\n"


def smoke_with(**sections) -> str:
    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml").read_text())
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return yaml.safe_dump(cfg)


FACTS_VOCAB = {"facts_key_tokens": 127, "facts_value_tokens": 128}  # with end-of-text and unk: 257 words
CASES = {
    "max_seq_len": (smoke_with(model={"max_seq_len": 64}), "model.max_seq_len=64: taken from the dataset"),
    "ep_sizes": (smoke_with(utilization={"ep_sizes": [2, 3]}), "utilization.ep_sizes[1]=3: does not divide"),
    "alias_bomb": ("study: bomb\n" + alias_bomb(), "an alias bomb"),
    "duplicate_key": ("study: dup\neval: {limit: 3}\neval: {limit: 4}\n", "duplicate key 'eval' (first at line 2)"),
    # {dataset}-{family}-{variant}-s{seed} would not split back into its parts
    "variant_hyphen": (
        smoke_with(experiments=[{"dataset": "graded", "families": ["mohge"], "variants": {"my-var": {}}}]),
        "experiments[0].variants='my-var': '-' separates the parts of a run name",
    ),
    # 4 facts of 5 tokens and one end-of-text: val and test hold 21 tokens, no window of seq_len + 1 = 26
    "seq_len_over_held_out": (
        smoke_with(
            datasets={"facts": {"source": "facts", "vocab_size": 257, "seq_len": 25, "facts_num": 4, **FACTS_VOCAB}},
            experiments=[{"dataset": "facts", "families": ["mohge"]}],
        ),
        "datasets.facts.seq_len=25: longer than the val and test splits of source 'facts' (21 tokens each",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_workflow_and_runs_list_refuse_the_same_configs_alike(case, tmp_path):
    text, needle = CASES[case]
    work = copy_workflow(tmp_path)
    (work / "bad.yaml").write_text(text)
    t0 = time.perf_counter()
    listed = runs_list(work, "bad.yaml")
    planned = smk("-n", "--configfile", "bad.yaml", cwd=work, timeout=120)
    assert time.perf_counter() - t0 < 120  # the alias bomb: refused before it is expanded, not after minutes
    assert listed.returncode == 2 and planned.returncode != 0, (listed.stderr[-2000:], planned.stderr[-2000:])
    mine, theirs = refusal(listed.stderr, "ConfigError: ", work), refusal(planned.stderr, "config error: ", work)
    assert needle in mine and mine == theirs, (mine, theirs)
    assert "Traceback" not in listed.stderr + planned.stderr
    assert not (work / "work").exists()


def test_a_config_file_above_the_size_cap_is_refused_unread(tmp_path):
    work = copy_workflow(tmp_path)
    (work / "big.yaml").write_text("study: big\n" + "#" * (1 << 20) + "\n")
    listed = runs_list(work, "big.yaml")
    assert listed.returncode == 2 and "big.yaml: 1048588 bytes, more than the 1048576" in listed.stderr


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def test_a_config_naming_a_committed_study_is_refused_before_any_job(tmp_path):
    """`study: default` over configs/smoke.yaml would rewrite results/default/: refused in one line; the default
    config itself still plans; git status stays clean."""
    work = copy_workflow(tmp_path)
    (work / ".gitignore").write_text(".snakemake/\n/work/\n/logs/\n")
    (work / "results" / "default").mkdir(parents=True)
    (work / "results" / "default" / "runs.csv").write_text("run\n")
    git("init", "-q", cwd=work)
    git("add", "-A", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fixture", cwd=work)
    out = smk("-n", "--configfile", "configs/smoke.yaml", "--config", "study=default", cwd=work)
    assert out.returncode != 0
    line = refusal(out.stderr, "config error: ", work)
    assert line.startswith("study='default': results/default/ holds 1 committed files, made by configs/config.yaml")
    assert "name another study" in line and "--config study=NAME" in line
    ok = smk("-n", cwd=work)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert git("status", "--porcelain", "--untracked-files=all", cwd=work) == ""
