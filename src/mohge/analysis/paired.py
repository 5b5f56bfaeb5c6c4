"""Paired tests on log ratios, their intervals and their declared power: the statistics every study table shares.

Every comparison of two models is paired by seed (seed s fixes the data order of every model) and works on the log
of the metric, so a difference is a ratio:

    d_s = log m_A(s) - log m_B(s),   ratio = exp(mean d),   95 % CI = exp(t-interval of mean d)

:func:`compare` runs one declared test (TOST, non-inferiority, one-sided, two-sided; scipy.stats) and
:func:`power_row` gives its power at the declared effect and its 80 % minimum detectable effect (noncentral t),
never the "observed power" at the observed effect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats


def t_interval(values: Sequence[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, low, high): the Student-t interval of the mean; (mean, nan, nan) for fewer than 2 values, (mean, mean,
    mean) when all values are equal."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan
    if np.ptp(x) == 0:  # every value equal: the interval is that value (scipy would give nan)
        return mean, mean, mean
    lo, hi = stats.t.interval(1 - alpha, len(x) - 1, loc=mean, scale=stats.sem(x))
    return mean, float(lo), float(hi)


def power_one_sided(n: int, sd: float, effect: float, alpha: float = 0.05) -> float:
    """Power of a one-sided one-sample t test (n values, sd) when the true mean lies ``effect`` > 0 beyond the
    null value in the direction of H1: P(T > t_{1-alpha}) with T noncentral t, ncp = effect * sqrt(n) / sd."""
    if n < 2 or not sd > 0:
        return math.nan
    crit, ncp = stats.t.ppf(1 - alpha, n - 1), effect * math.sqrt(n) / sd
    return _tail(float(stats.nct.sf(crit, n - 1, ncp)), ncp - crit)


def power_two_sided(n: int, sd: float, effect: float, alpha: float = 0.05) -> float:
    """Power of a two-sided one-sample t test at a true mean ``effect`` away from the null value."""
    if n < 2 or not sd > 0:
        return math.nan
    crit, ncp = stats.t.ppf(1 - alpha / 2, n - 1), abs(effect) * math.sqrt(n) / sd
    return _tail(float(stats.nct.sf(crit, n - 1, ncp) + stats.nct.cdf(-crit, n - 1, ncp)), ncp - crit)


def _tail(power: float, margin: float) -> float:
    """scipy's noncentral t is nan far in its tail (ncp of hundreds): power is then 1 (0 far below)."""
    return power if power == power else float(margin > 0)


def power_tost(n: int, sd: float, bound: float, true_mean: float = 0.0, alpha: float = 0.05) -> float:
    """Power of TOST at +-``bound`` (both one-sided t tests at alpha share one sd estimate s).

    Given s, TOST rejects iff -bound + t s / sqrt(n) < mean < bound - t s / sqrt(n), with mean ~ N(true_mean,
    sd^2 / n); integrated over (n - 1) s^2 / sd^2 ~ chi^2_{n-1}."""
    if n < 2 or not sd > 0:
        return math.nan
    from scipy import integrate

    df, crit, se = n - 1, stats.t.ppf(1 - alpha, n - 1), sd / math.sqrt(n)

    def given(q: float) -> float:  # q = chi^2 draw; s = sd * sqrt(q / df)
        half = bound - crit * sd * math.sqrt(q / df) / math.sqrt(n)
        if half <= 0:
            return 0.0
        p = stats.norm.cdf((half - true_mean) / se) - stats.norm.cdf((-half - true_mean) / se)
        return float(p * stats.chi2.pdf(q, df))

    # beyond q_empty the acceptance region is empty; beyond q_tail the chi^2 density is below 1e-12 of its mass
    q_empty = df * (bound * math.sqrt(n) / (crit * sd)) ** 2
    q_max = min(q_empty, float(stats.chi2.ppf(1 - 1e-12, df)))
    mode = min(max(df - 2.0, 0.0), q_max)  # where the density peaks: quad must not step over it
    pieces = [(0.0, mode), (mode, q_max)] if 0 < mode < q_max else [(0.0, q_max)]
    return float(sum(integrate.quad(given, a, b, limit=200)[0] for a, b in pieces)) if q_max > 0 else 0.0


def detectable(power_at, target: float = 0.8, hi: float = 1.0) -> float:
    """The smallest x > 0 with power_at(x) >= target (power_at increasing in x); nan if above ``hi``."""
    from scipy import optimize

    if not power_at(hi) >= target:
        return math.nan
    if power_at(1e-9) >= target:  # no spread at all (equal differences): any effect is detected
        return 0.0
    return float(optimize.brentq(lambda x: power_at(x) - target, 1e-9, hi, xtol=1e-10))


def power_row(d: pd.Series, test: str, alpha: float, margin: float) -> dict:
    """The declared power of one paired test on log ratios ``d`` and its minimum detectable effect at 80 %.

    ``power``: at a true ratio of exactly 1 for "tost" and "noninferiority" (equivalence holds), at a true
    difference of the margin (ratio 1 / (1 + margin)) for "less" and "two-sided". ``mde80_pct``: for "less" and
    "two-sided", the perplexity difference (%) detected with 80 % power; for "tost" and "noninferiority", the
    smallest margin (%) that such a test would pass with 80 % power at a true ratio of 1."""
    n, sd = len(d), float(np.std(d, ddof=1)) if len(d) > 1 else math.nan
    row = {"sd": sd, "power": math.nan, "power_at": "", "mde80_pct": math.nan}
    if n < 2 or not sd > 0:
        return row
    bound = math.log1p(margin)
    curves = {  # test -> (power as a function of the effect or margin on the log scale, where power is read)
        "tost": (lambda b: power_tost(n, sd, b, 0.0, alpha), "ratio 1"),
        "noninferiority": (lambda b: power_one_sided(n, sd, b, alpha), "ratio 1"),
        "less": (lambda b: power_one_sided(n, sd, b, alpha), f"ratio {1 / (1 + margin):.3f}"),
        "two-sided": (lambda b: power_two_sided(n, sd, b, alpha), f"ratio {1 / (1 + margin):.3f} or {1 + margin:.2f}"),
    }
    fn, at = curves[test]
    row.update(power=fn(bound), power_at=at)
    row["mde80_pct"] = 100 * math.expm1(detectable(fn))
    return row


def paired_log_diffs(runs: pd.DataFrame, metric: str, a: str, b: str) -> pd.Series:
    """log metric(a) - log metric(b) per seed, over the seeds both models have (index: seed)."""
    wide = runs[runs["family"].isin([a, b])].pivot_table(index="seed", columns="family", values=metric)
    if a not in wide or b not in wide:
        return pd.Series(dtype=np.float64)
    wide = wide.dropna(subset=[a, b])
    return np.log(wide[a]) - np.log(wide[b])


def compare(d: pd.Series, test: str, alpha: float, margin: float = 0.0) -> dict:
    """One paired comparison: n, the ratio with its 95 % and 90 % CIs, the test's p-value and decision, and its
    declared power (:func:`power_row`).

    ``test``: "tost" (equivalence within +-margin; p_lower / p_upper are its two legs), "noninferiority" (the upper
    leg alone, H1: ratio < 1 + margin), "less" (one-sided, A lower), "two-sided". A TOST or one-sided test at
    alpha reads the 1 - 2 alpha interval (90 % at alpha 0.05); a two-sided test the 1 - alpha interval."""
    n = len(d)
    row = {
        "n": n, "ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "ci90_low": math.nan,
        "ci90_high": math.nan, "p": math.nan, "p_lower": math.nan, "p_upper": math.nan, "decision": "n < 2",
    }  # fmt: skip
    if n < 2:
        return {**row, **power_row(d, test, alpha, margin)}
    mean, lo, hi = t_interval(d.to_numpy(), alpha)
    _, lo90, hi90 = t_interval(d.to_numpy(), 2 * alpha)
    row.update(ratio=math.exp(mean), ci_low=math.exp(lo), ci_high=math.exp(hi))
    row.update(ci90_low=math.exp(lo90), ci90_high=math.exp(hi90))
    bound = math.log1p(margin)
    if test in ("tost", "noninferiority"):
        p_low = float(stats.ttest_1samp(d, -bound, alternative="greater").pvalue)
        p_high = float(stats.ttest_1samp(d, bound, alternative="less").pvalue)
        row.update(p_lower=p_low, p_upper=p_high)
    if test == "tost":
        row["p"] = max(row["p_lower"], row["p_upper"])
        row["decision"] = f"equivalent within ±{margin:.0%}" if row["p"] < alpha else "equivalence not shown"
    elif test == "noninferiority":
        row["p"] = row["p_upper"]
        ok = row["p"] < alpha
        row["decision"] = f"non-inferior (margin {margin:.0%})" if ok else "non-inferiority not shown"
    elif test == "less":
        row["p"] = float(stats.ttest_1samp(d, 0.0, alternative="less").pvalue)
        row["decision"] = "A lower" if row["p"] < alpha else "A not shown lower"
    else:
        row["p"] = float(stats.ttest_1samp(d, 0.0).pvalue)
        row["decision"] = ("A lower" if mean < 0 else "A higher") if row["p"] < alpha else "not separated"
    return {**row, **power_row(d, test, alpha, margin)}
