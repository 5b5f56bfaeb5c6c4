"""The claims study's tables S1-S4 and S8 (written as CSV and Markdown by mohge_studies.claims.analysis) also as
LaTeX tabulars.

Inputs: s1 (S1_models.csv), s2 (S2_tests.csv), s3 (S3_balance.csv), s4 (S4_difficulty.csv), s8 (S8_controls.csv);
each optional.
Outputs: keys starting with the table and ending in _tex (s1_tex, S2_tests_tex, ...); _md also works.
Every mean carries its 95% CI as [low, high] and every row its n seeds. Nothing is bold: the decisions are the
pre-declared tests of S2, printed in its Decision column.
"""

from pathlib import Path

import mohge_studies.analysis.plotstyle as ps
import pandas as pd

CI_NOTE = "Mean [95% Student-t CI] over n seeds; no interval with n = 1. Nothing is bold: S2's tests decide."
SPLIT = {"test_ppl": "Test PPL (full split)", "val_ppl": "Val PPL (full split)"}


def ci(mean: float, low: float, high: float, digits: int = 2) -> str:
    if mean != mean:
        return "—"
    if low != low or high != high:
        return f"{mean:.{digits}f} [—]"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def cis(df: pd.DataFrame, col: str, low: str, high: str, digits: int = 2) -> list[str]:
    return [ci(m, lo, hi, digits) for m, lo, hi in zip(df[col], df[low], df[high], strict=True)]


def s1_models(t: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    d = pd.DataFrame({"Dataset": t["dataset"], "Model": t["model"].map(ps.family_label), "n": t["n"]})
    d["Total params"] = t["total_params"].map(ps.fmt_params)
    d["Activated (learned routing)"] = t["activated_learned"].map(ps.fmt_params)
    d["Activated (uniform routing)"] = t["activated_uniform"].map(ps.fmt_params)
    for m in ("test_ppl", "val_ppl"):
        if m in t:
            d[f"{SPLIT[m]} ↓"] = cis(t, m, f"{m}_low", f"{m}_high")
    if "unused_experts" in t:
        d["Unused experts / layer"] = t["unused_experts"].map(lambda v: "—" if v != v else f"{v:.1f}")
    caption = "Models of the study: parameters, perplexity, and unused experts per MoE layer (under 1% of a uniform "
    return d, caption + "share of the test split's routed slots, mean over layers and seeds; by layer in S7)."


def s2_tests(t: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    d = pd.DataFrame({"Question": t["question"], "Metric": t["metric"].map(lambda m: SPLIT.get(m, m))})
    d["A / B"] = [f"{ps.family_label(a)} / {ps.family_label(b)}" for a, b in zip(t["A"], t["B"], strict=True)]
    d["Test"] = t["test"]
    if "role" in t:
        d["Declared"] = (
            t["role"]
            .map({"pre-declared": "before", "post hoc (added after the results)": "after (post hoc)"})
            .fillna("")
        )
    d["n pairs"] = t["n"]
    d["PPL ratio A/B [95% CI]"] = cis(t, "ratio", "ci_low", "ci_high", 3)
    if "ci90_low" in t:
        d["90% CI"] = [
            ci(r, lo, hi, 3).partition(" ")[2]
            for r, lo, hi in zip(t["ratio"], t["ci90_low"], t["ci90_high"], strict=True)
        ]
    d["p"] = t["p"].map(p_text)
    if "p_holm" in t:
        d["p (Holm)"] = t["p_holm"].map(p_text)
    if "power" in t:
        d["Power (at)"] = [
            "—" if p != p else f"{p:.2f} ({at})" for p, at in zip(t["power"], t["power_at"].fillna(""), strict=True)
        ]
        d["MDE 80% (%)"] = t["mde80_pct"].map(lambda v: "—" if v != v else f"{v:.1f}")
    d["Decision"] = t["decision"]
    caption = "Paired tests on log-perplexity (ratio of perplexities, paired by seed). TOST, non-inferiority and "
    caption += "one-sided tests read the 90% CI, two-sided tests the 95% CI. Power at the declared effect (not the "
    caption += "observed one); MDE 80%: the difference (for TOST and non-inferiority: the margin) detected with "
    caption += "80% power. p (Holm): adjusted within its family (per metric, the pre-declared tests one family, "
    caption += "the post-hoc tests another). Q1's rows decide 'not decidable (gate)' unless MoE-208 and MoE-256 "
    caption += "separate at 95%, the declared condition for deciding Q1."
    return d, caption


def p_text(p: float) -> str:
    return "—" if p != p else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def s3_balance(t: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    d = pd.DataFrame({"Dataset": t["dataset"], "Model": t["model"].map(ps.family_label)})
    if "trace" in t:
        d["Trace"] = t["trace"]
    d["Strategy"] = t["strategy"].map(ps.strategy_label)
    d["EP"] = t["ep_size"].astype(int)
    d["n"] = t["n"]
    d["max/mean ↓"] = cis(t, "max_over_mean", "ci_low", "ci_high", 3)
    if "note" in t:
        d["Note"] = t["note"].fillna("")
    caption = "Per-GPU load: max / mean expert FLOPs over EP ranks (layer 'all'), over the seeds' routing traces: "
    caption += "geometric mean [exponentiated t interval of the mean log, lower end truncated at 1]."
    return d, caption


def s4_difficulty(t: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    d = pd.DataFrame({"Dataset": t["dataset"], "Model": t["model"].map(ps.family_label), "n": t["n"]})
    for level in ("easy", "medium", "hard"):
        if level in t:
            d[f"{level} width"] = cis(t, level, f"{level}_low", f"{level}_high", 1)
    if "easy_minus_hard" in t:
        d["easy − hard"] = cis(t, "easy_minus_hard", "emh_low", "emh_high", 1)
    d["Activated (learned routing)"] = t["activated_params"].map(ps.fmt_params)
    d["Test PPL (full split) ↓"] = cis(t, "test_ppl", "test_ppl_low", "test_ppl_high")
    return d, "Mean routed expert width per difficulty level (easy − hard paired by seed)."


def s8_controls(t: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    d = pd.DataFrame({"Arm": t["arm"], "Question": t["question"]})
    d["A / B"] = [
        " / ".join(ps.family_label(m) for m in (a, b) if isinstance(m, str) and m)
        for a, b in zip(t["A"], t["B"], strict=True)
    ]
    d["Test"], d["Status"] = t["test"], t["status"]
    d["n pairs"] = t["n"].map(lambda v: "—" if v != v else f"{int(v)}")
    d["PPL ratio A/B [95% CI]"] = cis(t, "ratio", "ci_low", "ci_high", 3)
    d["p"] = t["p"].map(p_text)
    if "p_holm" in t:
        d["p (Holm)"] = t["p_holm"].map(p_text)
    at = t["power_at"].astype(object).fillna("")  # all empty (nothing run yet) reads as a float column
    d["Power (at)"] = ["—" if p != p else f"{p:.2f} ({a})" for p, a in zip(t["power"], at, strict=True)]
    d["MDE 80% (%)"] = t["mde80_pct"].map(lambda v: "—" if v != v else f"{v:.1f}")
    d["Decision"] = t["decision_holm"] if "decision_holm" in t else t["decision"]
    d["Note"] = t["note"].astype(object).fillna("")
    caption = "The controls of Q1b declared after the results, paired by seed on log test perplexity as in S2; "
    caption += "declared, not run: no numbers yet. p (Holm): adjusted over the family of S8's 7 paired tests; the "
    caption += "decision reads the Holm p. (c) chooses each family's best lr on the test split it then tests on. "
    caption += "The last row restates Q1b by its declared rule, on the Holm decisions."
    return d, caption


BUILDS = {"s1": s1_models, "s2": s2_tests, "s3": s3_balance, "s4": s4_difficulty, "s8": s8_controls}


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Write the study tables S1-S4 and S8 as LaTeX (and Markdown where asked)."""
    for prefix, build in BUILDS.items():
        if not (inputs.get(prefix) and any(ps.table_key(k, prefix) for k in outputs)):
            continue
        outs = {k: v for k, v in outputs.items() if ps.table_key(k, prefix) and not k.lower().endswith("_csv")}
        t = ps.read_csv(inputs[prefix])
        if t.empty:
            ps.write_table(t, t, outs, prefix, f"no rows in {Path(inputs[prefix]).name}", by="study_tables.py")
            continue
        d, caption = build(t)
        left = {"s2": 4 + ("role" in t), "s3": 3 + ("trace" in t), "s8": 5}.get(prefix, 2)  # text columns: left
        ps.write_table(t, d, outs, prefix, caption, left=left, notes=[CI_NOTE], by="study_tables.py")


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
