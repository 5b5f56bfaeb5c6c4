"""The statistics of every study table, figure and record: Student-t intervals and tests, their power, the
delta method, the OLS slope and the Holm adjustment. Nothing else in the package computes an interval or a p-value.

Owns:
  one-sample and paired t (:func:`one_sample`, :func:`paired`): a mean and its standard error, df = n - 1; a paired
      design is the one-sample test of the differences. On log ratios d = log A - log B the mean is the log of a
      ratio of geometric means: ``exp`` of the estimate and of the interval bounds is the ratio and its interval.
  Welch (:func:`welch`): two unpaired samples, the difference of their means with the unpooled standard error and
      Welch-Satterthwaite df. On log values it is the ratio of geometric means of A and B.
  :class:`TEstimate`: any of these (and an OLS slope), with its (1 - alpha) interval and one p-value per null:
      ``p_h0_le(c)`` (H0: true value <= c; H1: > c), ``p_h0_ge(c)`` (H0: >= c), ``p_h0_eq(c)`` (two-sided) and
      ``p_tost(lo, hi)`` (H0: true value <= lo or >= hi; rejecting it shows equivalence within (lo, hi)).
      A test at alpha rejects iff its p < alpha. On log ratios a null ratio r is the null value log r: the
      non-inferiority of "A is at least 0.97 of B" tests H0 ratio <= 0.97 with ``p_h0_le(log 0.97)``.
  power and minimum detectable effect (:func:`power_one_sided`, :func:`power_two_sided`, :func:`power_tost`,
      :func:`power_welch`, :func:`detectable`): noncentral t at an sd given (observed), t quantiles; the power at a
      declared effect, never the "observed power" at the observed effect.
  :func:`delta_interval`: a smooth function of estimates, its t interval from the delta-method variance of each
      independent source and their Welch-Satterthwaite df.
  :func:`ols_line`: least squares of y on x, the slope as a :class:`TEstimate` (df = n - 2).
  :func:`holm`: Holm's step-down adjustment of the p-values of one declared family.
  :func:`spearman` and :func:`stratified_permutation_test` (Spearman's rho against permutations within strata).
  :func:`p_binomial_h0_le` (exact binomial, H0: at or below chance) and :func:`fisher_combined_p` (Fisher's
      combination of independent p-values).
  :func:`compare` and :func:`power_row`: one declared paired test on log ratios as a study-table row (S2, S8, S9).

Degenerate samples (the same rule everywhere):
  * n < 2 (one-sample), fewer than 2 values in either Welch sample, fewer than 3 points or one distinct x in a
    fit: no spread can be estimated, so the interval, every p-value, the power and the detectable effect are nan.
    The estimate itself is given when there is at least one value (nan with none).
  * Every value equal (sd 0; for Welch both samples constant; for a fit every point on the line): the estimate is
    known without error. The interval collapses to the estimate; the t statistic is +-inf, so p is 0 or 1, for a
    null other than the estimate, and 0 / 0 (p nan) for a null equal to it. The power is 1 for an effect > 0 and
    the detectable effect is 0. Welch's df is 0 / 0 then (nan); nothing reads it.
  * Fewer than :data:`MIN_INFORMATIVE_DF` (2) degrees of freedom: the interval and p exist but say little
    (t_0.975 is 12.7 at 1 df against 4.3 at 2): :attr:`TEstimate.informative` is False, and a table prints the
    per-seed values instead of the interval.
Intervals of a TOST or one-sided test at alpha are the (1 - 2 alpha) interval; two-sided ones the (1 - alpha).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special as _special

__all__ = [
    "TEstimate",
    "compare",
    "delta_interval",
    "delta_variance",
    "detectable",
    "fisher_combined_p",
    "holm",
    "OlsLine",
    "ols_line",
    "one_sample",
    "p_binomial_h0_le",
    "paired",
    "power_one_sided",
    "power_row",
    "power_tost",
    "power_two_sided",
    "power_welch",
    "sample_sd",
    "satterthwaite_df",
    "spearman",
    "stratified_permutation_test",
    "t_half_width",
    "t_interval",
    "t_quantile",
    "welch",
    "welch_contrast",
]

MIN_INFORMATIVE_DF = 2.0  # an interval on fewer degrees of freedom is not printed (module docstring)


def _values(values: Sequence[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


def _lower(alpha: float) -> float:
    """alpha / 2, as (1 - confidence) / 2: the quantiles scipy.stats.t.interval reads for a (1 - alpha) interval."""
    return (1 - (1 - alpha)) / 2


def _upper(alpha: float) -> float:
    """1 - alpha / 2, as (1 + confidence) / 2."""
    return (1 + (1 - alpha)) / 2


def _scipy_stats():
    """scipy.stats, imported where a test needs more than Student's t: its import is about half a second of the
    start-up of every process that reads this module (each figure job), and t's quantiles and tails come from
    scipy.special."""
    from scipy import stats

    return stats


def _t_ppf(q, df):
    """``scipy.stats.t.ppf(q, df)`` to the bit, from scipy.special: scipy's t computes its quantile as
    ``special.stdtrit(df, q)`` times the scale 1 plus the location 0, the ends of the support at q 0 and 1, and nan
    where df <= 0 or q lies outside [0, 1] (tests/unit/test_stats.py holds the two equal)."""
    q, df = np.asarray(q, dtype=np.float64), np.asarray(df, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        inner = _special.stdtrit(df, q) * 1.0 + 0.0
    ends = np.where(q == 0, -np.inf, np.where(q == 1, np.inf, inner))
    return np.where((df > 0) & (q >= 0) & (q <= 1), ends, np.nan)


def t_quantile(q: float, df: float) -> float:
    """The q quantile of Student's t with df > 0 degrees of freedom."""
    return float(_t_ppf(q, df))


def t_half_width(sd, n, alpha: float = 0.05):
    """t_{n-1}(1 - alpha / 2) sd / sqrt(n): the half-width of the (1 - alpha) interval of a mean; nan where n < 2.
    Elementwise on arrays (the per-step bands of a curve)."""
    sd, n = np.asarray(sd, dtype=np.float64), np.asarray(n, dtype=np.float64)
    ok = n >= 2
    df = np.where(ok, n - 1, 1.0)
    out = np.where(ok, _t_ppf(_upper(alpha), df) * sd / np.sqrt(np.where(ok, n, 1.0)), np.nan)
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class TEstimate:
    """A location estimate with a Student-t sampling distribution: (estimate - true) / se ~ t(df).

    ``n``: the values behind it (one-sample: n; Welch: n_a + n_b; a fit: its points). ``se`` is 0 when the data
    have no spread, nan when it cannot be estimated (module docstring). ``t_se``, when given, is the same standard
    error as the t statistic divides it: for one sample scipy.stats.ttest_1samp's sqrt(var / n) (var from the second
    central moment), which can differ from ``se`` = sd / sqrt(n) (scipy.stats.t.interval's scale) in its last bit;
    with it every p and interval here is scipy's to the bit."""

    estimate: float
    se: float
    df: float
    n: int
    t_se: float = math.nan

    @property
    def defined(self) -> bool:
        """Whether an interval and tests exist (a spread was estimable)."""
        return self.se == self.se

    @property
    def informative(self) -> bool:
        """Whether the interval is worth printing: defined, on at least :data:`MIN_INFORMATIVE_DF` degrees of freedom
        (or known without error, se 0)."""
        return self.defined and (self.se == 0 or self.df >= MIN_INFORMATIVE_DF - 1e-9)  # 2 + 2 equal spreads: 2

    def half_width(self, alpha: float = 0.05) -> float:
        """t_df(1 - alpha / 2) se: 0 when se is 0, nan when undefined."""
        if not self.defined:
            return math.nan
        return 0.0 if self.se == 0 else t_quantile(_upper(alpha), self.df) * self.se

    def interval(self, alpha: float = 0.05) -> tuple[float, float]:
        """The two-sided (1 - alpha) interval (low, high)."""
        if not self.defined:
            return math.nan, math.nan
        if self.se == 0:
            return self.estimate, self.estimate
        lo, hi = t_quantile(_lower(alpha), self.df), t_quantile(_upper(alpha), self.df)
        return lo * self.se + self.estimate, hi * self.se + self.estimate

    def t(self, null: float) -> float:
        """(estimate - null) / se; +-inf with se 0 and estimate != null; nan if undefined or 0 / 0."""
        if not self.defined:
            return math.nan
        diff = self.estimate - null
        if self.se == 0:
            return math.nan if diff == 0 else math.copysign(math.inf, diff)
        return diff / (self.t_se if self.t_se == self.t_se else self.se)

    def _p(self, null: float, tail: str) -> float:
        t = self.t(null)
        if t != t:
            return math.nan
        if math.isinf(t):  # no spread: certain, whatever the df
            up = t > 0
            return {"le": 0.0 if up else 1.0, "ge": 1.0 if up else 0.0, "eq": 0.0}[tail]
        if tail == "le":  # Student t's survival function, as scipy's tests evaluate it
            return float(_special.stdtr(self.df, -t))
        if tail == "ge":
            return float(_special.stdtr(self.df, t))
        return float(min(1.0, 2 * _special.stdtr(self.df, -abs(t))))

    def p_h0_le(self, null: float) -> float:
        """One-sided p of H0: true value <= ``null`` (H1: above it)."""
        return self._p(null, "le")

    def p_h0_ge(self, null: float) -> float:
        """One-sided p of H0: true value >= ``null`` (H1: below it)."""
        return self._p(null, "ge")

    def p_h0_eq(self, null: float = 0.0) -> float:
        """Two-sided p of H0: true value = ``null``."""
        return self._p(null, "eq")

    def p_tost(self, low: float, high: float) -> float:
        """TOST p of H0: true value <= ``low`` or >= ``high``: the larger of its two one-sided p-values. Below alpha,
        equivalence within (low, high) is shown; above it, nothing is (not-shown is not "different")."""
        return max(self.p_h0_le(low), self.p_h0_ge(high))


def one_sample(values: Sequence[float]) -> TEstimate:
    """The mean of ``values`` with se = sd / sqrt(n) (sd with ddof 1) and df = n - 1 (module docstring for n < 2 and
    equal values). Missing values (nan) are not dropped: drop them first."""
    x = _values(values)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    if n < 2:
        return TEstimate(mean, math.nan, math.nan, n)
    if np.ptp(x) == 0:  # every value equal: the mean is that value, exactly (a sum may round it)
        return TEstimate(float(x[0]), 0.0, float(n - 1), n)
    return TEstimate(mean, sample_sd(x) / math.sqrt(n), float(n - 1), n, math.sqrt(_moment_var(x) / n))


def sample_sd(values: Sequence[float]) -> float:
    """The sample standard deviation (ddof 1): 0 when every value is equal, nan for fewer than 2 values."""
    x = _values(values)
    if len(x) < 2:
        return math.nan
    return 0.0 if np.ptp(x) == 0 else float(np.std(x, ddof=1))


def _moment_var(x: np.ndarray) -> float:
    """The sample variance (ddof 1) as scipy's t tests compute it: the second central moment times n / (n - 1)."""
    n = len(x)
    return float(np.mean((x - x.mean()) ** 2) * (n / (n - 1)))


def paired(a: Sequence[float], b: Sequence[float]) -> TEstimate:
    """The paired test of a - b, element by element (a[i] and b[i] share a unit: the same seed's data order)."""
    a, b = _values(a), _values(b)
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    return one_sample(a - b)


def satterthwaite_df(variances: Sequence[float], dfs: Sequence[float]) -> float:
    """Welch-Satterthwaite df of a sum of independent variance estimates: (sum v)^2 / sum(v^2 / df); nan for 0 / 0."""
    v, d = _values(variances), _values(dfs)
    den = float(np.sum(v**2 / d))
    return float(np.sum(v)) ** 2 / den if den > 0 else math.nan


def welch(a: Sequence[float], b: Sequence[float]) -> TEstimate:
    """mean(a) - mean(b) of two unpaired samples: se = sqrt(s_a^2 / n_a + s_b^2 / n_b), Welch-Satterthwaite df.
    On log values, exp of the estimate is the ratio of geometric means of a and b."""
    a, b = _values(a), _values(b)
    na, nb = len(a), len(b)
    est = one_sample(a).estimate - one_sample(b).estimate if na and nb else math.nan
    if na < 2 or nb < 2:
        return TEstimate(est, math.nan, math.nan, na + nb)
    va = 0.0 if np.ptp(a) == 0 else _moment_var(a) / na
    vb = 0.0 if np.ptp(b) == 0 else _moment_var(b) / nb
    return TEstimate(est, math.sqrt(va + vb), satterthwaite_df([va, vb], [na - 1, nb - 1]), na + nb)


def welch_contrast(samples: Sequence[Sequence[float]], weights: Sequence[float]) -> TEstimate:
    """sum_i w_i mean(samples_i) of independent unpaired samples: se = sqrt(sum w_i^2 s_i^2 / n_i), df the
    Welch-Satterthwaite df over the samples (``welch`` is the contrast (1, -1) of two). On log values, (1, -1, -1, 1)
    of (A1, B1, A0, B0) is the log of the ratio of the ratios A1 / B1 and A0 / B0 of geometric means."""
    xs = [_values(x) for x in samples]
    w = [float(v) for v in weights]
    if len(xs) != len(w):
        raise ValueError(f"{len(xs)} samples and {len(w)} weights")
    n = sum(len(x) for x in xs)
    if any(len(x) == 0 for x in xs):
        return TEstimate(math.nan, math.nan, math.nan, n)
    est = sum(wi * one_sample(x).estimate for wi, x in zip(w, xs, strict=True))
    if any(len(x) < 2 for x in xs):
        return TEstimate(est, math.nan, math.nan, n)
    v = [0.0 if np.ptp(x) == 0 else wi**2 * _moment_var(x) / len(x) for wi, x in zip(w, xs, strict=True)]
    return TEstimate(est, math.sqrt(sum(v)), satterthwaite_df(v, [len(x) - 1 for x in xs]), n)


def t_interval(values: Sequence[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, low, high): the one-sample (1 - alpha) t interval of the mean; (mean, nan, nan) for one value,
    (mean, mean, mean) when all values are equal, all nan for none."""
    est = one_sample(values)
    return (est.estimate, *est.interval(alpha))


def ratio_interval(values: Sequence[float], alpha: float = 0.05, floor: float = 1.0) -> tuple[float, float, float]:
    """(geometric mean, low, high) of ratios bounded below by ``floor``: the exponentiated t interval of the mean
    log, its lower end raised to ``floor`` (the true value is >= floor, so the truncation keeps the coverage)."""
    x = np.log(np.maximum(np.asarray(values, dtype=np.float64), floor))
    mean, lo, hi = t_interval(x, alpha)
    return math.exp(mean), max(math.exp(lo), floor) if lo == lo else lo, math.exp(hi) if hi == hi else hi


def p_binomial_h0_le(successes: int, trials: int, chance: float) -> float:
    """Exact one-sided binomial p of H0: success probability <= ``chance`` (H1: above chance)."""
    return float(_scipy_stats().binomtest(successes, trials, chance, alternative="greater").pvalue)


def fisher_combined_p(pvalues: Sequence[float]) -> float:
    """Fisher's combination of independent p-values: the p of H0 "every one of their nulls holds" (-2 sum log p
    ~ chi^2 with 2k df); nan for none."""
    p = _values(pvalues)
    return float(_scipy_stats().combine_pvalues(p, method="fisher").pvalue) if len(p) else math.nan


# --------------------------------------------------------------------------------------------------------------
# rank correlation and its stratified permutation test


def _centred_ranks(x: np.ndarray) -> np.ndarray:
    r = _scipy_stats().rankdata(x).astype(np.float64)
    r -= r.mean()
    return r / (np.linalg.norm(r) or 1.0)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (average ranks for ties); nan for fewer than 3 values or a constant input."""
    x, y = np.asarray(x), np.asarray(y)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(_centred_ranks(x) @ _centred_ranks(y))


def stratified_permutation_test(
    x: np.ndarray, y: np.ndarray, strata: np.ndarray, n_perm: int = 200, seed: int = 0
) -> dict:
    """Spearman's rho of x with y against ``n_perm`` permutations of x within each stratum (same ranks, so each
    permuted rho is the Pearson correlation of the permuted ranks): the p of H0 "x and y are exchangeable within
    every stratum", two-sided about the null's mean, (1 + #{|rho* - mean| >= |rho - mean|}) / (1 + n_perm).
    Returns rho, the null's mean and sd, p, n_perm and n."""
    x, y, strata = np.asarray(x), np.asarray(y), np.asarray(strata)
    out = {"rho": spearman(x, y), "null_mean": math.nan, "null_sd": math.nan, "p": math.nan, "n_perm": n_perm}
    out["n"] = int(len(x))
    if out["rho"] != out["rho"] or n_perm < 1:
        return out
    rx, ry = _centred_ranks(x), _centred_ranks(y)
    groups = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    rng = np.random.default_rng(seed)
    null = np.empty(n_perm)
    perm = np.arange(len(x))
    for i in range(n_perm):
        for g in groups:
            perm[g] = rng.permutation(g)
        null[i] = rx[perm] @ ry
    centre = float(null.mean())
    extreme = np.abs(null - centre) >= abs(out["rho"] - centre) - 1e-12
    out.update(null_mean=centre, null_sd=float(null.std(ddof=1)) if n_perm > 1 else math.nan)
    out["p"] = float((1 + extreme.sum()) / (1 + n_perm))
    return out


# --------------------------------------------------------------------------------------------------------------
# power and the minimum detectable effect


def _power(df: float, se: float, effect: float, alpha: float, sided: str) -> float:
    """Power of a t test (df, standard error se) when the true value lies ``effect`` from the null, in the direction
    of H1 for a one-sided test: noncentral t with ncp = effect / se."""
    if se == 0:  # no spread: t is +-inf (rejects) off the null, 0 / 0 on it
        if effect == 0:
            return math.nan
        return 1.0 if sided == "two" or effect > 0 else 0.0
    if not (df == df and se == se):
        return math.nan
    ncp = abs(effect) / se if sided == "two" else effect / se
    nct = _scipy_stats().nct
    if sided == "one":
        crit = t_quantile(1 - alpha, df)
        return _tail(float(nct.sf(crit, df, ncp)), ncp - crit)
    crit = t_quantile(1 - alpha / 2, df)
    return _tail(float(nct.sf(crit, df, ncp) + nct.cdf(-crit, df, ncp)), ncp - crit)


def _tail(power: float, margin: float) -> float:
    """scipy's noncentral t is nan far in its tail (ncp of hundreds): power is then 1 (0 far below)."""
    return power if power == power else float(margin > 0)


def _sd_se(n: int, sd: float) -> tuple[float, float]:
    if n < 2 or not sd >= 0:
        return math.nan, math.nan
    return float(n - 1), sd / math.sqrt(n)


def power_one_sided(n: int, sd: float, effect: float, alpha: float = 0.05) -> float:
    """Power of a one-sided one-sample (or paired) t test of n values with sd ``sd`` when the true mean lies
    ``effect`` > 0 beyond the null value in the direction of H1: P(T > t_{1-alpha}), ncp = effect sqrt(n) / sd."""
    return _power(*_sd_se(n, sd), effect, alpha, "one")


def power_two_sided(n: int, sd: float, effect: float, alpha: float = 0.05) -> float:
    """Power of a two-sided one-sample (or paired) t test at a true mean ``effect`` away from the null value."""
    return _power(*_sd_se(n, sd), effect, alpha, "two")


def power_welch(
    n_a: int, sd_a: float, n_b: int, sd_b: float, effect: float, alpha: float = 0.05, sided: str = "two"
) -> float:
    """Power of Welch's test (``sided`` "one" or "two") at a true difference ``effect``, the sds taken as the truth:
    se = sqrt(sd_a^2 / n_a + sd_b^2 / n_b), Welch-Satterthwaite df from the same sds."""
    if n_a < 2 or n_b < 2 or not (sd_a >= 0 and sd_b >= 0):
        return math.nan
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    return _power(satterthwaite_df([va, vb], [n_a - 1, n_b - 1]), math.sqrt(va + vb), effect, alpha, sided)


def power_tost(n: int, sd: float, bound: float, true_mean: float = 0.0, alpha: float = 0.05) -> float:
    """Power of TOST at +-``bound`` (both one-sided t tests at alpha share one sd estimate s).

    Given s, TOST rejects iff -bound + t s / sqrt(n) < mean < bound - t s / sqrt(n), with mean ~ N(true_mean,
    sd^2 / n); integrated over (n - 1) s^2 / sd^2 ~ chi^2_{n-1}."""
    if n < 2 or not sd >= 0:
        return math.nan
    if sd == 0:
        return 1.0 if abs(true_mean) < bound else 0.0
    from scipy import integrate

    st = _scipy_stats()
    df, crit, se = n - 1, t_quantile(1 - alpha, n - 1), sd / math.sqrt(n)

    def given(q: float) -> float:  # q = chi^2 draw; s = sd * sqrt(q / df)
        half = bound - crit * sd * math.sqrt(q / df) / math.sqrt(n)
        if half <= 0:
            return 0.0
        p = st.norm.cdf((half - true_mean) / se) - st.norm.cdf((-half - true_mean) / se)
        return float(p * st.chi2.pdf(q, df))

    # beyond q_empty the acceptance region is empty; beyond q_tail the chi^2 density is below 1e-12 of its mass
    q_empty = df * (bound * math.sqrt(n) / (crit * sd)) ** 2
    q_max = min(q_empty, float(st.chi2.ppf(1 - 1e-12, df)))
    mode = min(max(df - 2.0, 0.0), q_max)  # where the density peaks: quad must not step over it
    pieces = [(0.0, mode), (mode, q_max)] if 0 < mode < q_max else [(0.0, q_max)]
    return float(sum(integrate.quad(given, a, b, limit=200)[0] for a, b in pieces)) if q_max > 0 else 0.0


def detectable(power_at: Callable[[float], float], target: float = 0.8, hi: float = 1.0) -> float:
    """The minimum detectable effect: the smallest x > 0 with power_at(x) >= target (power_at increasing in x);
    0 when even a vanishing effect is detected (no spread), nan when power_at is undefined or never reaches the
    target below ``hi``."""
    from scipy import optimize

    if not power_at(hi) >= target:
        return math.nan
    if power_at(1e-9) >= target:
        return 0.0
    return float(optimize.brentq(lambda x: power_at(x) - target, 1e-9, hi, xtol=1e-10))


# --------------------------------------------------------------------------------------------------------------
# the delta method, the OLS line, Holm


def delta_variance(gradient: Sequence[float], cov: np.ndarray) -> float:
    """gradient' cov gradient: the delta-method variance of f(theta) from the covariance of theta."""
    g = _values(gradient)
    return float(g @ np.asarray(cov, dtype=np.float64) @ g)


def delta_interval(
    estimate: float, variances: Sequence[float], dfs: Sequence[float], alpha: float = 0.05
) -> tuple[float, float, float]:
    """(low, high, df): estimate +- t_df(1 - alpha / 2) sqrt(sum variances), the variances being the delta-method
    variances of independent sources of error and ``dfs`` their degrees of freedom, combined by Welch-Satterthwaite.
    A nan variance gives no interval; a total of 0 collapses it."""
    v = _values(variances)
    if not len(v) or not np.isfinite(v).all() or not np.isfinite(_values(dfs)).all():
        return math.nan, math.nan, math.nan
    total = float(v.sum())
    df = satterthwaite_df(v, dfs)
    if total == 0:
        return estimate, estimate, df
    half = t_quantile(_upper(alpha), df) * math.sqrt(total)
    return estimate - half, estimate + half, df


@dataclass(frozen=True)
class OlsLine:
    """y = intercept + slope x by least squares: cov is the 2 x 2 covariance of (intercept, slope) with the residual
    variance on df = n - 2; ``slope_t`` carries the slope's interval and tests."""

    intercept: float
    slope: float
    cov: np.ndarray
    df: float
    n: int

    @property
    def slope_t(self) -> TEstimate:
        se = math.sqrt(self.cov[1, 1]) if self.df == self.df else math.nan
        return TEstimate(self.slope, se, self.df, self.n)


def ols_line(x: Sequence[float], y: Sequence[float]) -> OlsLine:
    """Least squares of ``y`` on ``x``; fewer than 3 points or one distinct x: coefficients where they exist (two
    points of distinct x), no covariance (nan)."""
    x, y = _values(x), _values(y)
    n = len(x)
    nan2 = np.full((2, 2), math.nan)
    if n < 2 or np.ptp(x) == 0:
        return OlsLine(math.nan, math.nan, nan2, math.nan, n)
    X = np.stack([np.ones_like(x), x], axis=1)
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    if n < 3:
        return OlsLine(float(beta[0]), float(beta[1]), nan2, math.nan, n)
    resid = y - X @ beta
    s2 = float(resid @ resid) / (n - 2)
    return OlsLine(float(beta[0]), float(beta[1]), s2 * np.linalg.inv(X.T @ X), float(n - 2), n)


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment within one declared family: the i-th smallest of m p-values becomes
    max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where the adjusted p < alpha controls the family-wise
    error at alpha. A nan p (a test that did not run) stays nan and is not counted in m."""
    p = _values(pvalues)
    out = np.full(len(p), math.nan)
    ok = np.flatnonzero(p == p)
    m = len(ok)
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[k]))
        out[k] = running
    return out


# --------------------------------------------------------------------------------------------------------------
# one declared paired test on log ratios, as a row of the study tables


def power_row(d: Sequence[float], test: str, alpha: float, margin: float) -> dict:
    """The declared power of one paired test on log ratios ``d`` and its minimum detectable effect at 80 %.

    ``power``: at a true ratio of exactly 1 for "tost" and "noninferiority" (equivalence holds), at a true
    difference of the margin (ratio 1 / (1 + margin)) for "less" and "two-sided". ``mde80_pct``: for "less" and
    "two-sided", the perplexity difference (%) detected with 80 % power; for "tost" and "noninferiority", the
    smallest margin (%) that such a test would pass with 80 % power at a true ratio of 1."""
    d = _values(d)
    n, sd = len(d), sample_sd(d)
    row = {"sd": sd, "power": math.nan, "power_at": "", "mde80_pct": math.nan}
    if n < 2:
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


def compare(d: Sequence[float], test: str, alpha: float, margin: float = 0.0) -> dict:
    """One paired comparison of A and B on log ratios d = log A - log B (lower is better: perplexity): n, the ratio
    exp(mean d) with its 95 % and 90 % CIs, the test's p-value and decision, and its declared power
    (:func:`power_row`).

    ``test`` and the null its ``p`` is the p-value of (m: ``margin``):
      "tost"            H0: ratio <= 1 / (1 + m) or ratio >= 1 + m (equivalence); ``p_lower`` is the p of
                        H0: ratio <= 1 / (1 + m), ``p_upper`` that of H0: ratio >= 1 + m, ``p`` the larger;
      "noninferiority"  H0: ratio >= 1 + m (A worse by the margin or more): ``p`` = ``p_upper``;
      "less"            H0: ratio >= 1 (A not lower);
      "two-sided"       H0: ratio = 1.
    A TOST or one-sided test at alpha reads the 1 - 2 alpha interval (90 % at alpha 0.05); a two-sided test the
    1 - alpha interval."""
    d = _values(d)
    n = len(d)
    row = {
        "n": n, "ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan, "ci90_low": math.nan,
        "ci90_high": math.nan, "p": math.nan, "p_lower": math.nan, "p_upper": math.nan, "decision": "n < 2",
    }  # fmt: skip
    if n < 2:
        return {**row, **power_row(d, test, alpha, margin)}
    est = one_sample(d)
    (lo, hi), (lo90, hi90) = est.interval(alpha), est.interval(2 * alpha)
    row.update(ratio=math.exp(est.estimate), ci_low=math.exp(lo), ci_high=math.exp(hi))
    row.update(ci90_low=math.exp(lo90), ci90_high=math.exp(hi90))
    bound = math.log1p(margin)
    if test in ("tost", "noninferiority"):
        row.update(p_lower=est.p_h0_le(-bound), p_upper=est.p_h0_ge(bound))
    if test == "tost":
        row["p"] = est.p_tost(-bound, bound)
        row["decision"] = f"equivalent within ±{margin:.0%}" if row["p"] < alpha else "equivalence not shown"
    elif test == "noninferiority":
        row["p"] = row["p_upper"]
        ok = row["p"] < alpha
        row["decision"] = f"non-inferior (margin {margin:.0%})" if ok else "non-inferiority not shown"
    elif test == "less":
        row["p"] = est.p_h0_ge(0.0)
        row["decision"] = "A lower" if row["p"] < alpha else "A not shown lower"
    else:
        row["p"] = est.p_h0_eq(0.0)
        row["decision"] = ("A lower" if est.estimate < 0 else "A higher") if row["p"] < alpha else "not separated"
    return {**row, **power_row(d, test, alpha, margin)}
