"""Each claim's verdict, read from the committed tables: ``mohge verdicts`` prints them, and README's "Results at a
glance" holds the bullets :func:`bullets` formats (tests/unit/test_verdicts.py compares them word for word).

Every number here is a committed table's cell (results/<study>/study/*.csv, results/<study>/tables/*.csv) or, for the
inference line, computed from the committed inference.csv by :mod:`mohge.core.stats`; nothing is typed in. A verdict
is the declared rule's as its table states it; an interval on fewer than 2 degrees of freedom is not printed (the
per-seed values are).

    mohge verdicts              # one line per claim: verdict, estimate [interval], the table it comes from
    mohge verdicts --markdown   # README's bullets
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mohge.core import stats

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Verdict:
    """One claim's reading: ``claim`` (its name and scope), ``verdict`` (the declared rule's word), ``estimate``
    (with its interval or per-seed values) and ``table`` (the committed file it comes from)."""

    claim: str
    verdict: str
    estimate: str
    table: str


PROSE = ("README.md", "docs/results.md", "docs/study.md")  # where the studies' numbers are written in sentences


def prose(root: Path = ROOT) -> str:
    """The README, docs/results.md and docs/study.md as one line of text, line breaks inside sentences and bold
    markers gone: what the tests that hold each sentence to its table search."""
    text = "".join((root / name).read_text() for name in PROSE)
    return " ".join(text.replace("**", "").split())


def _csv(root: Path, rel: str) -> pd.DataFrame:
    return pd.read_csv(root / rel)


def _ci(row: pd.Series, lo: str = "ci_low", hi: str = "ci_high", est: str = "estimate", digits: int = 3) -> str:
    """ "0.806× [0.789, 0.824]", or the estimate alone where the table prints no interval."""
    if row[lo] != row[lo]:
        return f"{row[est]:.{digits}f}×"
    return f"{row[est]:.{digits}f}× [{row[lo]:.{digits}f}, {row[hi]:.{digits}f}]"


def _p(p: float) -> str:
    return f"p = {p:.2g}" if p < 1e-3 else f"p = {p:.3f}"


def _seeds(per_seed: str) -> str:
    """C5's per-seed cell ("s10 0.885; s11 0.587") as prose ("0.885 (seed 10) and 0.587 (seed 11)")."""
    said = [f"{part.split()[1]} (seed {part.split()[0][1:]})" for part in per_seed.split("; ")]
    return ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]


# ---- claim 1 -------------------------------------------------------------------------------------------------------

C5 = "results/capacity/study/C5_best_shot.csv"
C6 = "results/capacity/study/C6_decomposition.csv"
C4 = "results/capacity/study/C4_selection.csv"
S2 = "results/claims/study/S2_tests.csv"


def _lr_choice(root: Path) -> str:
    """How far each family's chosen lr is ahead of the next lr on the selection seed, beside the seed-to-seed sd of
    log B of the confirmatory arms (C4, runs.csv)."""
    c4 = _csv(root, C4)
    kept = c4[c4["kept"]]
    gains = []
    for r in kept.itertuples():
        same = c4[(c4["family"] == r.family) & (c4["gate_mode"] == r.gate_mode) & (c4["lr"] == r.lr * 2)]
        gains.append(100 * (r.bits_stored / float(same["bits_stored"].iloc[0]) - 1))
    c5 = _csv(root, C5).set_index("test")
    runs = _csv(root, "results/capacity/runs.csv")
    arms = [
        c5.loc["G1 reference > equal", "a"],
        c5.loc["G1 reference > equal", "b"],
        c5.loc["Claim 1 non-inferiority", "a"],
    ]
    sds = [100 * stats.sample_sd(runs.loc[runs["family"] == a, "bits_stored"].map(math.log).to_numpy()) for a in arms]
    lr = f"{kept['lr'].iloc[0]:.0e}".replace("e-0", "e-")
    return (
        f"The lr, {lr}, is one selection seed's choice, not a shown optimum: {min(gains):.1f}–{max(gains):.1f} % more "
        f"than at twice that lr, within the seed-to-seed sd of log B ({min(sds):.1f}–{max(sds):.1f} %)."
    )


def _declared(interim: str) -> str:
    """The declared seeds of a test row's second model, from its verdict ``interim: n a/b of A/B declared``."""
    return interim.split(" of ")[1].split()[0].split("/")[1]


def _ladder(c5: pd.DataFrame) -> str:
    """The size ladder's sentence: per-seed values while an interval is not informative, the rule's reading after."""
    c1, g1 = c5.loc["Claim 1 at d_model 64"], c5.loc["G1 at d_model 64"]
    if c1["n_a"] != c1["n_a"] or min(c1["n_a"], c1["n_b"]) == 0:
        return ""
    n = f"{int(c1['n_a'])} and {int(c1['n_b'])} seeds" if c1["n_a"] != c1["n_b"] else f"{int(c1['n_a'])} seeds each"
    if not g1["n_b"]:
        gate = "MoE-12 for its gate not yet in"
    elif str(g1["verdict"]).startswith("interim"):
        gate = f"its gate G1 not yet read, MoE-12 at {int(g1['n_b'])} of {_declared(g1['verdict'])} seeds"
    elif g1["verdict"] in ("pass", "fail"):
        gate = f"its gate G1 {'passing' if g1['verdict'] == 'pass' else 'failing'} at {_ci(g1).replace('×', '')}"
    else:
        gate = f"its gate G1: {g1['verdict']}"
    if c1["ci_low"] != c1["ci_low"]:
        read = f"{c1['estimate']:.3f}×, per seed {_seeds(c1['per_seed'])}, no interval below 2 degrees of freedom"
    elif str(c1["verdict"]).startswith("interim"):
        read = f"{_ci(c1)}, no verdict before the declared seeds are in"
    else:
        read = f"{_ci(c1)}, {c1['verdict']}"
    interim = any(str(r["verdict"]).startswith("interim") for r in (c1, g1)) or not g1["n_b"]
    return f"At d_model 64 ({n}{' so far' if interim else ''}, {gate}): {read}."


def claim_1(root: Path = ROOT) -> tuple[list[Verdict], str]:
    c5 = _csv(root, C5).set_index("test")
    c6 = _csv(root, C6).query("d_model == 32").set_index("factor")
    g1, c1, het = (c5.loc[t] for t in ("G1 reference > equal", "Claim 1 non-inferiority", "Heterogeneity"))
    s2 = _csv(root, S2).query("metric == 'test_ppl'")
    sens = s2[(s2["question"] == "sensitivity") & (s2["A"] == "moe_equal") & (s2["B"] == "moe")].iloc[0]
    q1 = s2.set_index("question").loc["Q1 parity"]
    factor = {k.split(":")[0]: r for k, r in c6.iterrows()}
    router, width, params = (factor[k] for k in ("router factor", "width factor", "parameter factor"))
    verdicts = [
        Verdict("Claim 1, stored knowledge, d_model 32", c1["verdict"], f"MoHGE / MoE-15 {_ci(c1)}", C5),
        Verdict("Claim 1, gate G1 at d_model 32", g1["verdict"], f"MoE-15 / MoE-12 {_ci(g1)}", C5),
    ]
    c64 = c5.loc["Claim 1 at d_model 64"]
    if c64["n_a"] == c64["n_a"] and min(c64["n_a"], c64["n_b"]) > 0:
        est = _ci(c64) if c64["ci_low"] == c64["ci_low"] else f"{c64['estimate']:.3f}× ({_seeds(c64['per_seed'])})"
        verdicts.append(Verdict("Claim 1, stored knowledge, d_model 64", c64["verdict"], f"MoHGE / MoE-15 {est}", C5))
    verdicts.append(
        Verdict(
            "Claim 1, perplexity (claims study)",
            "not decidable" if sens["decision"] == "not separated" else str(q1["decision"]),
            f"MoE-208 / MoE-256 {sens['ratio']:.3f} [{sens['ci_low']:.3f}, {sens['ci_high']:.3f}]",
            S2,
        )
    )
    ladder = _ladder(c5)
    text = (
        "**Claim 1, equal quality with ~20 % fewer total parameters: "
        f"{c1['verdict']} at d_model 32 on stored knowledge; not decidable on perplexity.** MoHGE given its best shot "
        f"({int(c1['n_a'])} seeds a model, G1 passing at {_ci(g1).replace('×', '')}) stores {_ci(c1)} the bits of "
        f"MoE-15 ({_p(c1['p'])} for H0: ratio ≥ 0.97) and {_ci(het)} those of the equal-parameter MoE-12. Taken apart "
        f"(C6): MoHGE's router, gate and losses against HMoE's {_ci(router)}, the widths {_ci(width)}, the parameters "
        f"{_ci(params)}. {_lr_choice(root)} {ladder} On perplexity (claims study) MoE-208 and MoE-256 must separate "
        f"and do not (ratio {sens['ratio']:.3f} [{sens['ci_low']:.3f}, {sens['ci_high']:.3f}], p = {sens['p']:.2f}). "
        "[C5](results/capacity/study/C5_best_shot.md), [C6](results/capacity/study/C6_decomposition.md), "
        "[figure](figures/capacity/C1_bits_params.png)."
    )
    return verdicts, " ".join(text.split())


# ---- claim 2 -------------------------------------------------------------------------------------------------------

S6 = "results/claims/study/S6_balance_decision.csv"
S11 = "results/claims/study/S11_bias_balance.csv"


GROUP_ARMS = {"mohge+groupbias": "the group bias alone", "mohge+biasfree_groups": "group and expert biases"}


def _group_arms(s11: pd.DataFrame) -> str:
    """The group-bias arms' sentence: each run arm's verdict and the goals it misses; "running" before."""
    rows = s11[s11["A"].isin(list(GROUP_ARMS)) & (s11["goal"] == "verdict")]
    if rows.empty:
        return ""
    if (rows["status"] != "run").all():
        return "Arms that keep every group selected by a group bias are running."
    said = []
    for r in rows.itertuples():
        if r.status != "run":
            said.append(f"{GROUP_ARMS[r.A]} running")
            continue
        missed = [g.split(": ")[0] for g in str(r.note).split("; ") if g.endswith(": not met")]
        said.append(f"{GROUP_ARMS[r.A]} {r.decision}" + (f" ({', '.join(missed)} not met)" if missed else ""))
    return "Keeping every group selected (S11): " + "; ".join(said) + "."


def claim_2(root: Path = ROOT) -> tuple[list[Verdict], str]:
    s6 = _csv(root, S6).query("trace == 'trained'").set_index("model")
    release, strong = s6.loc["mohge"], s6.loc["mohge+ae2e1"]
    s3 = _csv(root, "results/claims/study/S3_balance.csv")
    even = s3[(s3["trace"] == "even_within_groups") & (s3["model"] == "mohge") & (s3["strategy"] == "all_size")]
    even4 = even[even["ep_size"] == 4].iloc[0]
    s11 = _csv(root, S11)
    arm = s11[s11["A"] == "mohge+biasfree"].set_index("question")
    bal, ni = arm.loc["all-size max/mean at EP 4"], arm.loc["not worse than the release recipe"]
    unused = arm.loc["experts under 1 % of a uniform share", "note"]
    per_layer = [float(x.split(": ")[1]) for x in unused.split(";")[0].removeprefix("mean per layer: ").split(", ")]
    idle = " and ".join(f"{u:.1f}" for u in per_layer if u > 0)
    word = "not supported" if release["decision"] == "bar not met" else "supported"  # the release recipe's claim
    verdicts = [
        Verdict(
            "Claim 2, all-size balance on trained routing",
            word,
            f"max/mean at EP 4 {release['all_size']:.2f} "
            f"[{release['all_size_low']:.2f}, {release['all_size_high']:.2f}]",
            S6,
        ),
        Verdict(
            "Claim 2, balance without a loss (expert bias)",
            str(arm.loc["balance holds on trained routing without a loss?", "decision"]),
            f"max/mean at EP 4 {bal['estimate']:.2f} [{bal['ci_low']:.2f}, {bal['ci_high']:.2f}]",
            S11,
        ),
    ]
    text = (
        f"**Claim 2, balanced per-GPU load from the all-size allocation: {word} on trained routing.** Max/mean "
        f"{release['all_size']:.2f} [{release['all_size_low']:.2f}, {release['all_size_high']:.2f}] at EP 4 against "
        f"contiguous {release['contiguous']:.2f} (n = {release['n']}); exactly {even4['max_over_mean']:.3f} only when "
        "routing is even inside groups (an identity); α_E 2e-1: "
        f"{strong['all_size']:.2f} [{strong['all_size_low']:.2f}, {strong['all_size_high']:.2f}] "
        f"(n = {strong['n']}). "
        f"An expert selection bias instead of the loss reaches {bal['estimate']:.2f} [{bal['ci_low']:.2f}, "
        f"{bal['ci_high']:.2f}] (its own goal met, Q2's bar of an interval below 1.10 not), leaves {idle} of 32 "
        "experts unused in two of three layers, whole groups among them, and is not shown non-inferior on perplexity "
        f"({ni['estimate']:.3f}, one-sided 95 % bound {ni['ci_high']:.3f} against 1.02, p = {ni['p']:.2f}). "
        f"{_group_arms(s11)} [S6](results/claims/study/S6_balance_decision.md), "
        "[S11](results/claims/study/S11_bias_balance.md)."
    )
    return verdicts, " ".join(text.split())


# ---- claim 3 -------------------------------------------------------------------------------------------------------

S9 = "results/claims/study/S9_q3_dose.csv"


def claim_3(root: Path = ROOT) -> tuple[list[Verdict], str]:
    s9 = _csv(root, S9)
    shown = (s9["emh_high"] < 0).any()  # easy tokens narrower than hard ones: easy - hard below 0
    lo, hi = s9["alpha_G"].min(), s9["alpha_G"].max()
    word = "shown" if shown else f"not shown at any α_G from {lo:g} to {hi:g}"
    best = s9.loc[s9["emh_high"].idxmin()]
    verdicts = [
        Verdict(
            "Claim 3, easy tokens to smaller experts",
            "shown" if shown else "not shown",
            f"easy − hard routed width at α_G {best['alpha_G']:g} (its lowest upper end): "
            f"{best['easy_minus_hard']:.1f} [{best['emh_low']:.1f}, {best['emh_high']:.1f}]",
            S9,
        )
    ]
    text = (
        f"**Claim 3, easy tokens routed to smaller experts: {word}**; where the Group-Wise loss moves routing it "
        "narrows every difficulty level, and easy tokens are not shown to narrow more than hard ones. "
        "[S9](results/claims/study/S9_q3_dose.md), [F11](figures/claims/F11_study_difficulty.png)."
    )
    return verdicts, " ".join(text.split())


# ---- inference cost and steering -----------------------------------------------------------------------------------

T4 = "results/default/tables/T4_inference.csv"
T5 = "results/frontier/tables/T5_frontier.csv"


def inference(root: Path = ROOT) -> tuple[list[Verdict], str]:
    """The default study's inference line: T4's means, and an unpaired Welch test on log validation perplexity over
    the runs of inference.csv (the perplexity of the inference record, over its own tokens)."""
    t4 = _csv(root, T4).query("dataset == 'shakespeare'").set_index(["family", "point"])
    m, e, d, k = (t4.loc[key] for key in (("mohge", "trained"), ("moe", "trained"), ("dense", "trained"),
                                          ("mohge", "topk=3")))  # fmt: skip
    runs = _csv(root, "results/default/inference.csv").query("dataset == 'shakespeare' and point == 'trained'")
    log_ppl = {f: runs.loc[runs["family"] == f, "val_ppl"].map(math.log).to_numpy() for f in ("mohge", "moe")}
    est = stats.welch(log_ppl["mohge"], log_ppl["moe"])
    lo, hi = est.interval(0.05)
    p = est.p_h0_eq(0.0)
    tokens = int(runs["n_tokens"].iloc[0])
    read = "not separated" if p >= 0.05 else ("MoHGE lower" if est.estimate < 0 else "MoHGE higher")
    ratio = f"{math.exp(est.estimate):.3f}× MoE's [{math.exp(lo):.3f}, {math.exp(hi):.3f}]"
    verdicts = [Verdict("Inference cost (default study, decides nothing)", read, f"perplexity {ratio}", T4)]
    text = (
        "**Inference cost, measured in the default study (which decides nothing):** as trained, MoHGE activates "
        f"{m['flops_per_token'] / 1e6:.2f} M forward FLOPs per token against MoE's {e['flops_per_token'] / 1e6:.2f} M "
        f"({m['flops_per_token'] / e['flops_per_token']:.2f}×), at a validation perplexity (over the inference "
        f"record's {tokens:,} tokens) {ratio} (unpaired Welch on log perplexity, n = {m['n']} each, p = {p:.2f}: "
        f"{read}). Served at top-3 without retraining it spends {k['flops_per_token'] / 1e6:.2f} M at perplexity "
        f"{k['val_ppl']:.1f}; the one dense run reaches {d['val_ppl']:.1f} at {d['flops_per_token'] / 1e6:.2f} M. "
        "[T4](results/default/tables/T4_inference.md), [F13](figures/default/F13_inference.png)."
    )
    return verdicts, " ".join(text.split())


def steering(root: Path = ROOT) -> tuple[list[Verdict], str]:
    t5 = _csv(root, T5).iloc[0]
    pairs = [float(x.split()[1]) for x in str(t5["per_pair"]).split("; ")]
    side = "above" if all(v > 1 for v in pairs) else ("below" if all(v < 1 for v in pairs) else "")
    direction = (
        f", though every pair lies {side} 1 ({', '.join(f'{v:.3f}' for v in pairs)}): the direction favours "
        f"{'cutting at serving time' if side == 'above' else 'steering at training time'}, not shown at α = 0.05"
        if side and t5["verdict"] == "not separated"
        else ""
    )
    verdicts = [
        Verdict(
            "Steering at training time against cutting at serving time",
            str(t5["verdict"]),
            f"perplexity at equal FLOPs {t5['ppl_ratio']:.3f}× [{t5['ci_low']:.3f}, {t5['ci_high']:.3f}]",
            T5,
        )
    ]
    text = (
        "**Steering at training time against cutting at serving time (served-frontier study):** MoHGE trained with the "
        "Group-Wise loss at a dose that moves routing runs at "
        f"{t5['flops_ratio_trained']:.3f}× [{t5['flops_low']:.3f}, {t5['flops_high']:.3f}] the FLOPs per token of the "
        f"unsteered model, and at that cost its perplexity is {t5['ppl_ratio']:.3f}× [{t5['ci_low']:.3f}, "
        f"{t5['ci_high']:.3f}] what the unsteered model reaches served with cheaper routing "
        f"(n = {t5['n_pairs']} pairs, "
        f"p = {t5['p']:.3f}): {t5['verdict']}{direction}. [T5](results/frontier/tables/T5_frontier.md), "
        "[F13](figures/frontier/F13_inference.png)."
    )
    return verdicts, " ".join(text.split())


PARTS = (claim_1, claim_2, claim_3, inference, steering)


def verdicts(root: Path = ROOT) -> list[Verdict]:
    """Every claim's verdicts, in README's order."""
    return [v for part in PARTS for v in part(root)[0]]


def bullets(root: Path = ROOT) -> list[str]:
    """README's "Results at a glance" bullets (without the leading "- "), one line each."""
    return [part(root)[1] for part in PARTS]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge verdicts",
        description="Each claim's verdict, estimate and interval, read from the committed tables (docs/study.md "
        "declares the rules; docs/results.md has the tests behind them).",
    )
    ap.add_argument("--markdown", action="store_true", help="print README's 'Results at a glance' bullets instead")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose results/ to read (default: this one)")
    a = ap.parse_args(argv)
    if a.markdown:
        print("\n".join(f"- {b}" for b in bullets(a.root)))
        return 0
    rows = verdicts(a.root)
    width = max(len(v.claim) for v in rows)
    for v in rows:
        print(f"{v.claim:<{width}}  {v.verdict}\n{'':<{width}}  {v.estimate}  ({v.table})")
    return 0
