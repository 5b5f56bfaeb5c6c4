"""`mohge verdicts` and README's "Results at a glance": the bullets README holds are the ones the function formats
from the committed tables, and their numbers are those of the committed runs, recomputed here independently."""

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mohge_studies.analysis import verdicts
from scipy import stats as sp

ROOT = Path(__file__).resolve().parents[2]


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_readme_holds_every_bullet_mohge_verdicts_formats():
    """H0 'README's glance is stale against the committed tables' fails when every bullet is in README as formatted."""
    readme = one_line((ROOT / "README.md").read_text())
    missing = [b[:80] for b in verdicts.bullets() if one_line(f"- {b}") not in readme]
    assert not missing, missing


def test_claim_1_numbers_are_welch_on_the_committed_runs():
    """The capacity verdict's ratio and interval, recomputed from runs.csv with scipy's Welch test on log B."""
    c5 = pd.read_csv(ROOT / verdicts.C5).set_index("test")
    runs = pd.read_csv(ROOT / "results" / "capacity" / "runs.csv")
    a, b = (np.log(runs.loc[runs["family"] == c5.loc["Claim 1 non-inferiority", k], "bits_stored"]) for k in "ab")
    t = sp.ttest_ind(a, b, equal_var=False)
    ci = t.confidence_interval(0.95)
    said = f"{math.exp(a.mean() - b.mean()):.3f}× [{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}]"
    p = sp.ttest_ind(a - math.log(0.97), b, equal_var=False, alternative="less").pvalue
    text = verdicts.claim_1()[1]
    assert f"stores {said} the bits of MoE-15" in text
    assert f"(p = {p:.2g} for H0: ratio ≥ 0.97)" in text


def test_the_lr_sentence_is_the_selection_runs_margin_and_the_seed_spread():
    """H0 'the lr choice is worded as an optimum' fails: the sentence gives the margin over twice the lr on one seed
    (from C4) beside the seed-to-seed sd of log B (from runs.csv), both recomputed here."""
    c4 = pd.read_csv(ROOT / verdicts.C4)
    kept = c4[c4["kept"]]
    gains = [100 * (r.bits_stored / c4[(c4.family == r.family) & (c4.gate_mode == r.gate_mode) & (c4.lr == 2 * r.lr)]
                    ["bits_stored"].iloc[0] - 1) for r in kept.itertuples()]  # fmt: skip
    runs = pd.read_csv(ROOT / "results" / "capacity" / "runs.csv")
    arms = ["mohge+best_renorm_lr5e3", "moe+best_lr5e3", "moe_equal+best_lr5e3"]
    sds = [100 * np.log(runs.loc[runs.family == f, "bits_stored"]).std(ddof=1) for f in arms]
    text = verdicts.claim_1()[1]
    assert f"{min(gains):.1f}–{max(gains):.1f} % more than at twice that lr" in text
    assert f"seed-to-seed sd of log B ({min(sds):.1f}–{max(sds):.1f} %)" in text
    assert "not a shown optimum" in text and "best of" not in text


def test_the_inference_line_labels_its_test_as_unpaired_welch_over_the_records_tokens():
    runs = pd.read_csv(ROOT / "results" / "default" / "inference.csv").query(
        "dataset == 'shakespeare' and point == 'trained'"
    )
    a, b = (np.log(runs.loc[runs.family == f, "val_ppl"]) for f in ("mohge", "moe"))
    p = sp.ttest_ind(a, b, equal_var=False).pvalue
    text = verdicts.inference()[1]
    assert f"over the inference record's {int(runs['n_tokens'].iloc[0]):,} tokens" in text
    assert f"(unpaired Welch on log perplexity, n = {len(a)} each, p = {p:.2f}" in text


def _root_with(tmp_path: Path, table: str, **cells) -> Path:
    """A copy of the committed results with one table's first row changed."""
    for rel in {verdicts.C4, verdicts.C5, verdicts.C6, verdicts.S2, verdicts.S6, verdicts.S11, verdicts.S9, verdicts.T4,
                verdicts.T5, "results/capacity/runs.csv", "results/claims/study/S3_balance.csv",
                "results/default/inference.csv"}:  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    df = pd.read_csv(tmp_path / table)
    for k, v in cells.items():
        df.loc[0, k] = v
    df.to_csv(tmp_path / table, index=False)
    return tmp_path


def test_a_not_separated_frontier_says_the_direction_of_its_pairs(tmp_path):
    """Every pair on one side of 1: the direction is said, and not as a finding; mixed pairs: no direction."""
    assert "every pair lies above 1 (1.063, 1.027, 1.032): the direction favours cutting" in verdicts.steering()[1]
    mixed = _root_with(tmp_path, verdicts.T5, per_pair="s0 1.063; s1 0.980; s2 1.032")
    text = verdicts.steering(mixed)[1]
    assert "not separated." in text and "direction" not in text


def test_the_cli_prints_one_entry_per_verdict_and_its_table(capsys):
    assert verdicts.main([]) == 0
    out = capsys.readouterr().out
    for v in verdicts.verdicts():
        assert v.claim in out and v.table in out
    assert verdicts.main(["--markdown"]) == 0
    assert capsys.readouterr().out == "".join(f"- {b}\n" for b in verdicts.bullets())


@pytest.mark.parametrize("verdict", ["supported", "undecided"])
def test_the_claim_1_bullet_says_the_verdict_its_table_gives(tmp_path, verdict):
    c5 = pd.read_csv(ROOT / verdicts.C5)
    row = int(np.flatnonzero(c5["test"] == "Claim 1 non-inferiority")[0])
    root = _root_with(tmp_path, verdicts.C4)
    c5.loc[row, "verdict"] = verdict
    c5.to_csv(root / verdicts.C5, index=False)
    assert f"{verdict} at d_model 32 on stored knowledge" in verdicts.claim_1(root)[1]
