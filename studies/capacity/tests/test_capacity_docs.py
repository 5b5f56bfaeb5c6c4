"""The capacity study's sentences in docs/results.md, formatted from its committed tables (C1, C2, C4, C5): a rerun
or an extension that moves a table and leaves the prose behind fails."""

from pathlib import Path

import pandas as pd
from mohge_studies.analysis.verdicts import prose

from mohge.core import stats
from mohge.core.vocab import GATE_MODE_ALIASES

ROOT = Path(__file__).resolve().parents[3]


def test_docs_agree_with_the_committed_capacity_tables():
    """docs/results.md ("The capacity study") carries C1/C2 numbers, formatted here from the committed tables: a
    rerun or an extension that moves a table and leaves the prose behind fails."""
    tables, text = ROOT / "results" / "capacity" / "study", prose()
    c2 = pd.read_csv(tables / "C2_tests.csv").set_index("test")
    g1, g2, g3 = c2.loc["G1 reference > equal"], c2.loc["G2 sweep slope"], c2.loc["G3 saturation (quarter set)"]
    claim, het = c2.loc["Claim 1 non-inferiority"], c2.loc["Heterogeneity"]
    size, size_ae = c2.loc["MoE-equivalent size of mohge"], c2.loc["MoE-equivalent size of mohge+ae5e2"]
    expect = [
        f"{claim['estimate']:.3f}× [{claim['ci_low']:.3f}, {claim['ci_high']:.3f}]",
        f"p = {claim['p']:.2g} for H0: ratio ≥ 0.97" if claim["h0"] == "ratio >= 0.97" else f"p = {claim['p']:.3f}",
        f"{het['estimate']:.3f}× [{het['ci_low']:.3f}, {het['ci_high']:.3f}], p = {het['p']:.3f}",
        f"{g1['estimate']:.3f} [{g1['ci_low']:.3f}, {g1['ci_high']:.3f}] (p = {g1['p']:.3f})",
        f"{g2['estimate']:.2f} [{g2['ci_low']:.2f}, {g2['ci_high']:.2f}]",
        f"ratio {g3['estimate']:.3f}",
        f"{size['estimate']:.2f}× [{size['ci_low']:.2f}, {size['ci_high']:.2f}]",
        f"{size_ae['estimate']:.2f}× [{size_ae['ci_low']:.2f}, {size_ae['ci_high']:.2f}]",
    ]
    assert g1["verdict"] == "fail" and "The gate fails" in (tables / "C2_tests.md").read_text()
    c1 = pd.read_csv(tables / "C1_models.csv").set_index(["dataset", "model"])
    for model in ("moe", "moe_equal", "mohge", "mohge+ae5e2"):
        row = c1.loc[("facts", model)]
        expect.append(f"{row['bits_stored'] / 1e3:.1f} k [{row['bits_low'] / 1e3:.1f}, {row['bits_high'] / 1e3:.1f}]")
    # the selection (C4): each family's B at lr 5e-3 / 1e-2 / 2e-2, the kept settings and MoHGE / MoE-15 there
    c4 = pd.read_csv(tables / "C4_selection.csv")
    kept = c4[c4["kept"]].set_index("family")
    assert kept["lr"].tolist() == [5e-3] * 3 and kept.loc["mohge", "gate_mode"] == "product_renorm"
    for fam, label in (("moe", "MoE-15"), ("moe_equal", "MoE-12")):
        expect.append(f"{label} {kept.loc[fam, 'bits_stored'] / 1e3:.1f} k")
    expect.append(f"{kept.loc['mohge', 'bits_stored'] / 1e3:.1f} k with the `product_renorm` gate")
    gate = c4["gate_mode"].replace(GATE_MODE_ALIASES)  # the table may spell the release's gate by its alias
    same_lr = (c4["family"] == "mohge") & (gate == "softmax_topk_probs") & (c4["lr"] == 5e-3)
    release = c4[same_lr]["bits_stored"].iloc[0]
    expect.append(f"({release / 1e3:.1f} k with the release's gate)")
    ratio = kept.loc["mohge", "bits_stored"] / kept.loc["moe", "bits_stored"]
    expect.append(f"MoHGE / MoE-15 is {ratio:.3f} there")
    # the best shot (C5): each confirmatory arm's B, G1, claim 1 and heterogeneity, by the declared rule
    c5 = pd.read_csv(tables / "C5_best_shot.csv").set_index("test")
    g1, claim, het = (c5.loc[t] for t in ("G1 reference > equal", "Claim 1 non-inferiority", "Heterogeneity"))
    assert (g1["verdict"], claim["verdict"], het["verdict"]) == ("pass", "refuted", "differs")
    assert "claim 1 refuted at this scale" in text and g1["p"] < 0.001 and het["p"] < 0.001
    expect += [
        f"G1, B_MoE-15 / B_MoE-12 = {g1['estimate']:.3f} [{g1['ci_low']:.3f}, {g1['ci_high']:.3f}]",
        f"MoHGE / MoE-15 = {claim['estimate']:.3f}× [{claim['ci_low']:.3f}, {claim['ci_high']:.3f}]",
        f"{het['estimate']:.3f}× [{het['ci_low']:.3f}, {het['ci_high']:.3f}], p < 0.001",
        f"first analysis's gap ({c2.loc['Claim 1 non-inferiority', 'estimate']:.3f}×)",
        f"MoE-15 stores {c5.loc['Edge: moe at lr 2.5e-3 / its choice', 'estimate']:.3f}×, MoE-12 "
        f"{c5.loc['Edge: moe_equal at lr 2.5e-3 / its choice', 'estimate']:.3f}× and MoHGE "
        f"{c5.loc['Edge: mohge at lr 2.5e-3 / its choice', 'estimate']:.3f}× what each stores at its choice",
        f"{c5.loc['quarter set: MoHGE / reference', 'n_a']} seeds against one of MoE-15, descriptive) MoHGE stores "
        f"{c5.loc['quarter set: MoHGE / reference', 'estimate']:.3f}× the bits of MoE-15",
    ]
    edges = c5.loc[[t for t in c5.index if t.startswith("Edge:")], "estimate"]
    assert len(edges) == 3 and (edges < 1).all() and "the lower lr helps none" in text
    # capacity or learning speed (descriptive) and the why arms (Holm over three), as their rows say
    long = c5.loc["400 exposures: MoHGE / MoE-15"]
    seeds = {1: "one seed", 2: "two seeds"}
    expect.append(
        f"At 400 exposures ({seeds[long['n_a']]} of each of the two declared, descriptive) MoHGE stores "
        f"{long['estimate']:.3f}× the bits of MoE-15, against {claim['estimate']:.3f}× at 200"
    )
    assert long["n_a"] == long["n_b"] and long["estimate"] > claim["ci_low"] and long["estimate"] < 0.97
    why = {t.removeprefix("Why: "): c5.loc[t] for t in c5.index if t.startswith("Why:")}
    assert all(row["n_a"] == 3 for row in why.values())
    reads = {
        "every width 12": "no difference shown",
        "HMoE's flat router": "differs",
        "the release's gate form": "differs",
    }
    for name, read in reads.items():
        row = why[name]
        holm_p, verdict = row["verdict"].removeprefix("Holm p ").split(": ")
        assert verdict == read, name
        expect.append(f"{row['estimate']:.3f}× [{row['ci_low']:.3f}, {row['ci_high']:.3f}]")
        expect.append(f"(Holm p {holm_p}): {'no difference shown' if read != 'differs' else 'it differs'}")
    runs = pd.read_csv(ROOT / "results" / "capacity" / "runs.csv")
    for label, arm in (("MoHGE", claim["a"]), ("MoE-12", g1["b"]), ("MoE-15", g1["a"])):
        mean, lo, hi = stats.t_interval(runs.loc[runs["family"] == arm, "bits_stored"].to_numpy())
        expect.append(f"{label} {mean / 1e3:.1f} k [{lo / 1e3:.1f}, {hi / 1e3:.1f}]")
    missing = [e for e in expect if e not in text]
    assert not missing, missing


def test_the_size_ladder_reads_as_its_c5_row_in_the_docs():
    """docs/results.md's d_model 64 sentence, formatted from C5's "Claim 1 at d_model 64" row: per-seed values while
    the interval is not informative, the declared reading after."""
    c5 = pd.read_csv(ROOT / "results" / "capacity" / "study" / "C5_best_shot.csv").set_index("test")
    row = c5.loc["Claim 1 at d_model 64"]
    docs = " ".join((ROOT / "docs" / "results.md").read_text().replace("**", "").split())
    if pd.isna(row["n_a"]) or min(row["n_a"], row["n_b"]) == 0:
        assert "At d_model 64" not in docs
        return
    if pd.isna(row["ci_low"]):
        seeds = " and ".join(part.split()[1] for part in row["per_seed"].split("; "))
        said = f"MoHGE stores {row['estimate']:.3f}× the bits of MoE-15 (per seed {seeds})"
        assert "no interval is given at about one degree of freedom" in docs
    else:
        said = f"MoHGE stores {row['estimate']:.3f}× [{row['ci_low']:.3f}, {row['ci_high']:.3f}] the bits of MoE-15"
    assert said in docs, said
    runs = pd.read_csv(ROOT / "results" / "capacity" / "runs.csv")
    b = {arm: runs.loc[runs["family"] == row[arm], "bits_stored"] / 1e3 for arm in ("a", "b")}
    share = runs.loc[runs["family"] == row["b"], "bits_stored"] / runs.loc[runs["family"] == row["b"], "data_bits"]
    n = {3: "3 seeds each of the 4 declared so far", 4: "4 seeds each of MoHGE"}[int(min(row["n_a"], row["n_b"]))]
    expect = [
        n,
        f"with MoE-15 storing {share.mean():.0%} of the set's bits",
        f"MoHGE's seeds spread from {b['a'].min():.1f} k to {b['a'].max():.1f} k bits while MoE-15's lie within "
        f"{b['b'].min():.1f} k to {b['b'].max():.1f} k",
    ]
    g1 = c5.loc["G1 at d_model 64"]
    if str(row["verdict"]).startswith("interim"):
        expect.append("No verdict is read before the declared seeds are in")
    elif row["verdict"] == "not decidable by the declared rule (G1 at 64)" and g1["verdict"] == "fail":
        values = [part.split()[1] for part in g1["per_seed"].split("; ")]
        expect.append(
            "Claim 1 at d_model 64 is not decidable by the declared rule: its gate G1 fails there, MoE-15 storing "
            f"{g1['estimate']:.3f}× [{g1['ci_low']:.3f}, {g1['ci_high']:.3f}] the bits of MoE-12 (per seed "
            f"{', '.join(values[:-1])} and {values[-1]})"
        )
        size = c5.loc["Size: (MoHGE / MoE-15 at 64) / (at 32)"]
        assert "G1 fails" in size["verdict"]
        expect.append(
            f"is an estimate only for the same reason: {size['estimate']:.3f}× [{size['ci_low']:.3f}, "
            f"{size['ci_high']:.3f}]"
        )
    elif row["verdict"] == "not decidable by the declared rule (G1 at 64)":
        expect.append("Claim 1 at d_model 64 is not decidable until its gate G1 is read")
    if str(g1["verdict"]).startswith("interim") and 0 < g1["n_b"] < 4:
        pairs = [part.split() for part in g1["per_seed"].split("; ")]
        ratios = " and ".join(f"{float(v):.3f}×" for _, v in pairs)
        seeds = " and ".join(s.removeprefix("s") for s, _ in pairs)
        expect.append(f"{int(g1['n_b'])} of MoE-12's 4 so far")
        expect.append(f"so far MoE-15 stores {ratios} the bits of MoE-12 (seeds {seeds};")
    missing = [e for e in expect if e not in docs]
    assert not missing, missing


def test_the_decomposition_paragraph_is_c6():
    """docs/results.md's "Where the deficit sits" paragraph, formatted from C6: each factor at d_model 32, and at 64
    each factor whose runs are in, per seed where its interval is not informative."""
    c6 = pd.read_csv(ROOT / "results" / "capacity" / "study" / "C6_decomposition.csv")
    docs = " ".join((ROOT / "docs" / "results.md").read_text().replace("**", "").split())

    def said(d_model: int, factor: str) -> str:
        row = c6[(c6["d_model"] == d_model) & c6["factor"].str.startswith(factor + ":")].iloc[0]
        if pd.isna(row["ci_low"]):
            values = [part.split()[1] for part in row["per_seed"].split("; ")]
            return f"{row['estimate']:.3f}× (per seed {' and '.join(values)}: no interval"
        return f"{row['estimate']:.3f}× [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"

    expect = [f"the {f} {said(32, f)}" for f in ("router factor", "width factor", "parameter factor")]
    at64 = c6[c6["d_model"] == 64]
    factors = ("router factor", "width factor", "parameter factor", "equal-parameter factor")
    for f in factors:
        if at64["factor"].str.startswith(f + ":").any():
            expect.append(f"the {f} {'is ' if f == 'router factor' else ''}{said(64, f)}")
    hmoe = at64.loc[at64["factor"].str.startswith("router factor:"), "n_b"]
    if len(hmoe) and int(hmoe.iloc[0]) < 4:
        expect.append(f"{int(hmoe.iloc[0])} of HMoE's 4 so far")
    missing = [e for e in expect if e not in docs]
    assert not missing, missing
