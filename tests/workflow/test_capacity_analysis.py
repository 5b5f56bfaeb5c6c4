"""The capacity study's declared analysis (workflow/scripts/capacity_analysis.py) on synthetic runs with known
answers: a gate that passes and a claim that holds, a gate that fails, the sweep fit and the equivalent size."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "workflow" / "scripts"


def _load():
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("capacity_analysis", SCRIPTS / "capacity_analysis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ca = _load()
P = {"moe+w9": 65696, "moe_equal": 84128, "moe": 102560, "moe+w19": 127136, "mohge": 84640, "mohge+ae5e2": 84640}


def synthetic(slope=0.8, mohge_vs_ref=1.0, ref_gain=None, noise=0.01, quarter_ratio=1.0) -> pd.DataFrame:
    """B = c P^slope for the homogeneous MoEs (3 seeds each), MoHGE at mohge_vs_ref x the reference."""
    rng = np.random.default_rng(0)
    rows = []
    for fam, p in P.items():
        for seed in range(3):
            b = 1e5 * (p / 84128) ** slope
            if fam.startswith("mohge"):
                b = 1e5 * (102560 / 84128) ** slope * mohge_vs_ref
            if fam == "moe" and ref_gain is not None:
                b = 1e5 * ref_gain
            b *= math.exp(noise * rng.standard_normal())
            rows.append({"run": f"facts-{fam}-s{seed}", "dataset": "facts", "family": fam, "seed": seed})
            rows[-1].update(bits_stored=b, total_params_non_embedding=p, total_params=p + 32896)
            rows[-1].update(data_bits=262144.0, fact_recall=0.3)
    for fam, b in (("moe+quarter", 60000.0 * quarter_ratio), ("moe_equal+quarter", 60000.0)):
        rows.append({"run": f"q-{fam}", "dataset": "facts_quarter", "family": fam, "seed": 0, "bits_stored": b})
        rows[-1].update(total_params_non_embedding=P[fam.split("+")[0]], total_params=1, data_bits=65536.0)
        rows[-1]["fact_recall"] = 0.9
    return pd.DataFrame(rows)


def test_a_sensitive_setup_passes_the_gate_and_decides_claim_1():
    df = synthetic(noise=0.004)  # with 3 seeds, 1 % noise on log B leaves a 3 % margin undecided (next test)
    tests, summary = ca.decide(df[df.dataset == "facts"], df[df.dataset == "facts_quarter"], ca.DEFAULTS)
    t = tests.set_index("test")
    assert summary["gate"]
    assert t.loc["G1 reference > iso", "estimate"] == pytest.approx((102560 / 84128) ** 0.8, rel=0.02)
    assert t.loc["G2 sweep slope", "estimate"] == pytest.approx(0.8, abs=0.1)
    assert t.loc["Claim 1 non-inferiority", "verdict"] == "supported"
    # MoHGE stores what the reference stores: its MoE-equivalent size is the reference's, 1.21 x its own
    eq = t.loc["MoE-equivalent size of mohge"]
    assert eq["estimate"] == pytest.approx(102560 / 84640, rel=0.03) and eq["ci_low"] < eq["estimate"] < eq["ci_high"]
    assert t.loc["Heterogeneity", "verdict"] == "differs"


def test_three_noisy_seeds_leave_claim_1_undecided():
    df = synthetic(noise=0.015)
    tests, _ = ca.decide(df[df.dataset == "facts"], df[df.dataset == "facts_quarter"], ca.DEFAULTS)
    assert tests.set_index("test").loc["Claim 1 non-inferiority", "verdict"] == "undecided"


def test_claim_1_is_refuted_when_mohge_stores_what_the_iso_moe_stores():
    df = synthetic(mohge_vs_ref=(84128 / 102560) ** 0.8)
    tests, _ = ca.decide(df[df.dataset == "facts"], df[df.dataset == "facts_quarter"], ca.DEFAULTS)
    t = tests.set_index("test")
    assert t.loc["Claim 1 non-inferiority", "verdict"] == "refuted"
    assert t.loc["Heterogeneity", "verdict"] == "no difference shown"


def test_a_blind_setup_fails_the_gate_and_says_so():
    df = synthetic(slope=0.05, ref_gain=1.01, quarter_ratio=1.1)
    tests, summary = ca.decide(df[df.dataset == "facts"], df[df.dataset == "facts_quarter"], ca.DEFAULTS)
    t = tests.set_index("test")
    assert not summary["gate"]
    assert t.loc["G1 reference > iso", "verdict"] == "fail"
    assert t.loc["G2 sweep slope", "verdict"] == "fail"
    assert t.loc["G3 saturation (quarter set)", "verdict"] == "fail"
    assert "gate fails" in t.loc["Claim 1 non-inferiority", "verdict"] or t.loc[
        "Claim 1 non-inferiority", "verdict"
    ] in ("undecided",)


def test_tables_figure_and_unused_experts(tmp_path):
    df = synthetic()
    df.to_csv(tmp_path / "runs.csv", index=False)
    trace = tmp_path / "facts-mohge-s0" / "trace.json"
    trace.parent.mkdir()
    counts = [100] * 32
    counts[0] = counts[5] = 0  # two experts of group 0 and 1 (widths 5 and 7) never routed
    layers = [{"counts": counts}, {"counts": [100] * 32}]
    trace.write_text(
        json.dumps(
            {"expert_widths": [5, 7, 9, 11, 13, 15, 17, 19], "experts_per_group": 4, "d_model": 32, "layers": layers}
        )
    )
    outs = {
        f"{t}_{e}": str(tmp_path / "out" / f"{t}.{e}")
        for t in ("C1_models", "C2_tests", "C3_unused")
        for e in ("csv", "md", "tex", "html")
    }
    outs.update(png=str(tmp_path / "fig.png"), pdf=str(tmp_path / "fig.pdf"))
    ca.main({"runs": str(tmp_path / "runs.csv"), "traces": [str(trace)]}, outs, {})
    unused = pd.read_csv(outs["C3_unused_csv"])
    row = unused[(unused.model == "mohge") & (unused.layer == 0)].iloc[0]
    assert row["unused"] == 2 and row["unused_params"] == 3 * 32 * (5 + 7)
    assert unused[(unused.model == "mohge") & (unused.layer == 1)].iloc[0]["unused"] == 0
    assert "The gate passes" in Path(outs["C2_tests_md"]).read_text()
    c1 = pd.read_csv(outs["C1_models_csv"])
    assert set(c1.model) >= {"mohge", "moe", "moe_equal"} and (c1[c1.dataset == "facts"].n == 3).all()
    assert Path(outs["png"]).stat().st_size > 0 and Path(outs["pdf"]).stat().st_size > 0
