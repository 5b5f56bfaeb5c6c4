"""The served-frontier test (docs/study.md "The served-frontier study"): a model at its trained routing against
another model's served frontier at equal activated FLOPs per token, paired by seed.

Reads the rows of ``inference.csv`` (workflow/scripts/inference_table.py: one row per run and served point, with
``family`` as family+variant, ``point``, ``val_ppl`` and ``flops_per_token``). For each seed both models share:

* f_A, p_A: model A's FLOPs per token and validation perplexity at its trained routing;
* B's served frontier: the lower envelope of B's points (trained and every knob point) in (FLOPs, perplexity),
  each point kept only if no cheaper-or-equal point has a lower perplexity; :func:`envelope_at` reads it at f_A,
  linear in log perplexity between the envelope points that bracket f_A, B's best perplexity above its costliest
  point, undefined (nan) below its cheapest;
* d = log p_A - log p_B(f_A).

The mean of d over the defined seeds, its 95 % interval and two-sided p (:func:`mohge.core.stats.paired` through
``one_sample``), the 80 % minimum detectable effect, and the verdict by the declared rule, as the ratio exp(d).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from mohge.core import stats

VERDICTS = ("training-time steering beats serving", "serving beats training-time steering", "not separated")
_SEED = re.compile(r"-s(\d+)$")


def seed_of(run: str) -> int:
    """The seed of a run name (``{dataset}-{family}[-{variant}]-s{seed}``)."""
    m = _SEED.search(run)
    if not m:
        raise ValueError(f"run {run!r}: no -s<seed> suffix")
    return int(m[1])


def lower_envelope(flops: Sequence[float], ppl: Sequence[float]) -> list[tuple[float, float]]:
    """The served points no cheaper-or-equal point beats, sorted by FLOPs: (flops, ppl) with ppl falling."""
    points = sorted(zip(map(float, flops), map(float, ppl), strict=True), key=lambda p: (p[0], p[1]))
    out: list[tuple[float, float]] = []
    for f, p in points:
        if not out or p < out[-1][1]:  # of equal costs the sort puts the lower perplexity first
            out.append((f, p))
    return out


def envelope_at(envelope: list[tuple[float, float]], f: float) -> tuple[float, str]:
    """(perplexity of the envelope at cost f, how it was read): interpolated in log perplexity between the two
    envelope points that bracket f; the best perplexity above the costliest point; nan below the cheapest."""
    if not envelope or f < envelope[0][0]:
        return math.nan, "below every served point"
    if f >= envelope[-1][0]:
        return envelope[-1][1], "at or above the costliest envelope point"
    for (f0, p0), (f1, p1) in zip(envelope, envelope[1:], strict=False):
        if f == f0:
            return p0, f"at {f0:.4g}"
        if f0 < f < f1:
            w = (f - f0) / (f1 - f0)
            return math.exp((1 - w) * math.log(p0) + w * math.log(p1)), f"between {f0:.4g} and {f1:.4g}"
    raise AssertionError("unreachable: f lies in the envelope's range")


def per_seed(rows: pd.DataFrame, trained: str, served: str) -> pd.DataFrame:
    """One row per seed both models have: f_A, p_A, B's trained FLOPs, p_B(f_A), how it was read, and d."""
    out = []
    a_rows = rows[(rows["family"] == trained) & (rows["point"] == "trained")]
    b_all = rows[rows["family"] == served]
    b_by_seed = {seed_of(r): g for r, g in b_all.groupby("run")}
    for _, a in a_rows.iterrows():
        seed = seed_of(a["run"])
        if seed not in b_by_seed:
            continue
        b = b_by_seed[seed]
        env = lower_envelope(b["flops_per_token"], b["val_ppl"])
        p_b, how = envelope_at(env, float(a["flops_per_token"]))
        b_trained = b[b["point"] == "trained"]
        out.append(
            {
                "seed": seed,
                "flops_a": float(a["flops_per_token"]),
                "ppl_a": float(a["val_ppl"]),
                "flops_b_trained": float(b_trained["flops_per_token"].iloc[0]) if len(b_trained) else math.nan,
                "ppl_b_trained": float(b_trained["val_ppl"].iloc[0]) if len(b_trained) else math.nan,
                "ppl_b_at_flops_a": p_b,
                "read": how,
                "d": math.log(float(a["val_ppl"])) - math.log(p_b) if p_b == p_b else math.nan,
            }
        )
    return pd.DataFrame(out).sort_values("seed").reset_index(drop=True) if out else pd.DataFrame()


def verdict(low: float, high: float) -> str:
    """The declared rule on the interval of exp(d)."""
    if high < 1:
        return VERDICTS[0]
    if low > 1:
        return VERDICTS[1]
    return VERDICTS[2]


def frontier_test(rows: pd.DataFrame, trained: str, served: str, alpha: float = 0.05) -> pd.DataFrame:
    """T5_frontier: the declared test as one row (see the module docstring), with the seeds it read."""
    seeds = per_seed(rows, trained, served)
    d = seeds["d"].dropna() if len(seeds) else pd.Series(dtype=float)
    est = stats.one_sample(d.to_numpy())
    low, high = est.interval(alpha)
    flops = (
        stats.one_sample(np.log(seeds["flops_a"] / seeds["flops_b_trained"]).dropna().to_numpy())
        if len(seeds)
        else stats.one_sample([])
    )
    f_low, f_high = flops.interval(alpha)
    sd = stats.sample_sd(d.to_numpy())
    mde = stats.detectable(lambda x: stats.power_two_sided(len(d), sd, x, alpha)) if len(d) >= 2 else math.nan
    defined = est.defined and low == low
    row = {
        "trained": trained,
        "served": served,
        "n_pairs": int(len(seeds)),
        "n_defined": int(len(d)),
        "ppl_ratio": math.exp(est.estimate) if est.estimate == est.estimate else math.nan,
        "ci_low": math.exp(low) if defined else math.nan,
        "ci_high": math.exp(high) if defined else math.nan,
        "p": est.p_h0_eq(0.0),
        "mde80_pct": 100 * (math.exp(mde) - 1) if mde == mde else math.nan,
        "flops_ratio_trained": math.exp(flops.estimate) if flops.estimate == flops.estimate else math.nan,
        "flops_low": math.exp(f_low) if f_low == f_low else math.nan,
        "flops_high": math.exp(f_high) if f_high == f_high else math.nan,
        "verdict": verdict(math.exp(low), math.exp(high)) if defined else "not decidable (fewer than 2 pairs)",
        "reads": "; ".join(f"s{int(s.seed)}: {s.read}" for s in seeds.itertuples()) if len(seeds) else "",
        # each pair's ratio: its direction, whatever the test decides
        "per_pair": "; ".join(f"s{int(s.seed)} {math.exp(s.d):.3f}" for s in seeds.itertuples() if s.d == s.d),
    }
    return pd.DataFrame([row])


CAPTION = (
    "**T5.** The served-frontier test (docs/study.md): validation perplexity of the trained model at its trained "
    "routing over the served model's frontier at the same activated FLOPs per token, paired by seed "
    "(ratio, 95 % t interval, two-sided p, 80 % MDE); the FLOPs ratio of the two trained routings beside it"
)
