"""mohge.core.stats against scipy.stats and cases computed by hand; a test is named by its null or what it shows."""

import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sp

from mohge.core import stats

X = np.array([1.0, 2.0, 4.0, 7.0])  # mean 3.5, sd sqrt(7), se sqrt(7) / 2
A = np.array([0.12, -0.03, 0.08, 0.21, 0.05, 0.10])
B = np.array([0.02, 0.04, -0.07, 0.01])


def test_one_sample_interval_is_the_textbook_t_interval_and_scipys():
    est = stats.one_sample(X)
    se = math.sqrt(7) / 2
    assert (est.estimate, est.df, est.n) == (3.5, 3.0, 4) and est.se == pytest.approx(se, rel=1e-15)
    half = 3.182446305284263 * se  # t_{3}(0.975)
    assert est.interval() == pytest.approx((3.5 - half, 3.5 + half), rel=1e-12)
    lo, hi = sp.t.interval(0.95, 3, loc=X.mean(), scale=sp.sem(X))
    assert est.interval(0.05) == (lo, hi)  # the same quantiles and scale: bit for bit
    assert stats.t_interval(X) == (3.5, lo, hi)
    assert est.half_width() == pytest.approx(half, rel=1e-12)


@pytest.mark.parametrize("null", [-1.0, 0.0, 3.5 + 1e-9, 6.0])
def test_one_sample_p_values_of_each_null_match_scipy_ttest_1samp(null):
    est = stats.one_sample(X)
    assert est.p_h0_le(null) == pytest.approx(sp.ttest_1samp(X, null, alternative="greater").pvalue, rel=1e-12)
    assert est.p_h0_ge(null) == pytest.approx(sp.ttest_1samp(X, null, alternative="less").pvalue, rel=1e-12)
    assert est.p_h0_eq(null) == pytest.approx(sp.ttest_1samp(X, null).pvalue, rel=1e-12)
    assert est.p_h0_le(null) + est.p_h0_ge(null) == pytest.approx(1.0)


def test_p_values_and_intervals_are_scipys_to_the_bit():
    rng = np.random.default_rng(0)
    for _ in range(300):
        x = rng.normal(rng.normal(), rng.uniform(0.01, 10), size=int(rng.integers(2, 40)))
        y = rng.normal(0.0, rng.uniform(0.01, 10), size=int(rng.integers(2, 40)))
        est, w = stats.one_sample(x), stats.welch(x, y)
        assert est.p_h0_eq(0.3) == sp.ttest_1samp(x, 0.3).pvalue
        assert est.p_h0_le(0.3) == sp.ttest_1samp(x, 0.3, alternative="greater").pvalue
        assert est.interval() == sp.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=sp.sem(x))
        assert w.p_h0_eq(0.0) == sp.ttest_ind(x, y, equal_var=False).pvalue


def test_paired_is_the_one_sample_test_of_differences_and_scipys_ttest_rel():
    a, b = A[:4], B
    est = stats.paired(a, b)
    assert est.estimate == pytest.approx(np.mean(a - b))
    assert est.p_h0_eq(0.0) == pytest.approx(sp.ttest_rel(a, b).pvalue, rel=1e-12)
    assert est.p_h0_ge(0.0) == pytest.approx(sp.ttest_rel(a, b, alternative="less").pvalue, rel=1e-12)
    with pytest.raises(ValueError, match="differ in length"):
        stats.paired(A, B)


def test_welch_matches_scipy_ttest_ind_unequal_variances():
    est = stats.welch(A, B)
    ref = sp.ttest_ind(A, B, equal_var=False)
    va, vb = A.var(ddof=1) / 6, B.var(ddof=1) / 4
    assert est.estimate == pytest.approx(A.mean() - B.mean()) and est.n == 10
    assert est.se == pytest.approx(math.sqrt(va + vb), rel=1e-12)
    assert est.df == pytest.approx((va + vb) ** 2 / (va**2 / 5 + vb**2 / 3), rel=1e-12)
    assert est.df == pytest.approx(ref.df, rel=1e-12)
    assert est.p_h0_eq(0.0) == pytest.approx(ref.pvalue, rel=1e-10)
    assert est.p_h0_le(0.0) == pytest.approx(
        sp.ttest_ind(A, B, equal_var=False, alternative="greater").pvalue, rel=1e-10
    )
    ci = ref.confidence_interval(0.95)
    assert est.interval() == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_welch_on_logs_is_the_ratio_of_geometric_means():
    a, b = np.array([2.0, 8.0]), np.array([1.0, 1.0, 4.0])  # geometric means 4 and 4 ** (1 / 3)
    est = stats.welch(np.log(a), np.log(b))
    assert math.exp(est.estimate) == pytest.approx(4 / 4 ** (1 / 3))


def test_h0_ratio_le_margin_is_the_non_inferiority_null_on_log_ratios():
    """A is at least 0.97 of B (higher is better): H0 ratio <= 0.97 is rejected when log ratios sit well above."""
    d = np.log([1.01, 0.99, 1.02, 1.00, 1.005])
    est = stats.one_sample(d)
    p = est.p_h0_le(math.log(0.97))
    assert p == pytest.approx(sp.ttest_1samp(d, math.log(0.97), alternative="greater").pvalue, rel=1e-12)
    assert p < 0.01 and est.p_h0_le(math.log(1.05)) > 0.99


def test_h0_outside_the_margin_tost_is_the_larger_one_sided_p():
    d = np.array([0.01, -0.005, 0.004, 0.0, 0.012, -0.002])
    est = stats.one_sample(d)
    b = math.log1p(0.03)
    p_low = sp.ttest_1samp(d, -b, alternative="greater").pvalue
    p_high = sp.ttest_1samp(d, b, alternative="less").pvalue
    assert est.p_tost(-b, b) == pytest.approx(max(p_low, p_high), rel=1e-12)
    assert est.p_tost(-b, b) < 0.05  # inside: equivalence shown
    assert stats.one_sample(d + 0.05).p_tost(-b, b) > 0.5  # outside: not shown


def test_t_quantiles_are_scipys():
    for df in (1, 2, 3, 6, 29, 30, 31, 120, 1000, 7.5):
        assert stats.t_quantile(0.975, df) == sp.t.ppf(0.975, df)
    assert stats.t_half_width(math.sqrt(7), 4) == pytest.approx(sp.t.ppf(0.975, 3) * math.sqrt(7) / 2, rel=1e-12)
    hw = stats.t_half_width(np.array([1.0, 2.0, 1.0]), np.array([1, 2, 9]))
    assert math.isnan(hw[0]) and hw[1] == pytest.approx(sp.t.ppf(0.975, 1) * 2 / math.sqrt(2))
    assert hw[2] == pytest.approx(sp.t.ppf(0.975, 8) / 3)


def test_the_t_quantile_without_scipy_stats_is_scipys_to_the_bit_and_scipy_stats_is_not_imported_for_it():
    """Every quantile of a grid (the ends of the support, q outside [0, 1], nan, df <= 0, fractional and huge df) is
    scipy.stats.t.ppf's bit for bit, as scalars and broadcast arrays; a process that asks for intervals only does not
    import scipy.stats."""
    q = np.array([0.0, 1e-300, 1e-12, 0.025, 0.05, 0.5, 0.9, 0.95, 0.975, 0.995, 1 - 1e-12, 1.0, -0.1, 1.1, np.nan])
    df = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 7.5, 29.0, 120.0, 1e6, 1e300, np.inf, np.nan])
    qq, dd = np.meshgrid(q, df)
    ours, theirs = stats._t_ppf(qq, dd), sp.t.ppf(qq, dd)
    assert ours.tobytes() == np.asarray(theirs, dtype=np.float64).tobytes()
    for a, b in zip(qq.ravel(), dd.ravel(), strict=True):
        assert np.float64(stats.t_quantile(a, b)).tobytes() == np.float64(sp.t.ppf(a, b)).tobytes(), (a, b)
    code = (
        "import sys; from mohge.core import stats; stats.one_sample([1.0, 2.0, 4.0]).interval(0.05); "
        "stats.t_half_width([1.0], [3]); print('scipy.stats' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_n_2_is_the_smallest_sample_with_an_interval():
    est = stats.one_sample([1.0, 3.0])  # mean 2, sd sqrt(2), se 1, df 1
    assert (est.estimate, est.df) == (2.0, 1.0) and est.se == pytest.approx(1.0)
    assert est.interval() == pytest.approx((2 - 12.706204736174698, 2 + 12.706204736174698), rel=1e-12)
    assert est.p_h0_eq(0.0) == pytest.approx(1 - 2 * math.atan(2) / math.pi, rel=1e-12)  # t = 2 on 1 df
    w = stats.welch([1.0, 3.0], [0.0, 0.0])  # one constant sample: df from the other alone
    assert w.df == pytest.approx(1.0) and w.se == pytest.approx(1.0)


def test_fewer_than_two_values_give_an_estimate_and_nothing_else():
    for values in ([5.0], []):
        est = stats.one_sample(values)
        assert math.isnan(est.se) and not est.defined and math.isnan(est.half_width())
        assert all(math.isnan(v) for v in (*est.interval(), est.p_h0_le(0), est.p_h0_ge(0), est.p_h0_eq(0)))
        assert math.isnan(est.p_tost(-1, 1))
    assert stats.one_sample([5.0]).estimate == 5.0 and math.isnan(stats.one_sample([]).estimate)
    assert stats.t_interval([5.0])[0] == 5.0 and math.isnan(stats.t_interval([5.0])[1])
    w = stats.welch([1.0, 2.0], [3.0])
    assert w.estimate == -1.5 and math.isnan(w.se) and math.isnan(w.p_h0_eq(0))
    assert math.isnan(stats.power_two_sided(1, 0.1, 0.1)) and math.isnan(stats.power_tost(1, 0.1, 0.1))
    assert math.isnan(stats.power_welch(1, 0.1, 5, 0.1, 0.1)) and math.isnan(stats.sample_sd([1.0]))


def test_all_equal_values_collapse_the_interval_and_make_p_certain_off_the_null():
    est = stats.one_sample([0.2, 0.2, 0.2])
    assert est.se == 0 and est.interval() == (0.2, 0.2) and est.half_width() == 0.0
    assert stats.t_interval([0.2, 0.2, 0.2]) == (est.estimate, est.estimate, est.estimate)
    assert (est.p_h0_le(0.0), est.p_h0_ge(0.0), est.p_h0_eq(0.0)) == (0.0, 1.0, 0.0)
    assert (est.p_h0_le(1.0), est.p_h0_ge(1.0), est.p_h0_eq(1.0)) == (1.0, 0.0, 0.0)
    assert sp.ttest_1samp([0.5, 0.5, 0.5], 0.0).pvalue == 0.0  # scipy agrees where its mean is exact
    with pytest.warns(RuntimeWarning, match="catastrophic cancellation"):  # scipy's mean rounds: a spread of 1e-17
        assert sp.ttest_1samp([0.2, 0.2, 0.2], 0.0).pvalue < 1e-30
    on = stats.one_sample([1.0, 1.0])  # on the null: 0 / 0
    assert math.isnan(on.p_h0_eq(1.0)) and math.isnan(sp.ttest_1samp([1.0, 1.0], 1.0).pvalue)
    assert est.p_tost(-1.0, 1.0) == 0.0 and est.p_tost(0.5, 1.0) == 1.0
    w = stats.welch([1.0, 1.0], [2.0, 2.0, 2.0])
    assert w.interval() == (-1.0, -1.0) and w.p_h0_eq(0.0) == 0.0 and math.isnan(w.df)
    assert stats.sample_sd([3.0, 3.0]) == 0.0
    assert stats.power_two_sided(3, 0.0, 0.01) == 1.0 and stats.power_one_sided(3, 0.0, -0.01) == 0.0
    assert stats.power_tost(3, 0.0, 0.03) == 1.0 and math.isnan(stats.power_two_sided(3, 0.0, 0.0))
    assert stats.detectable(lambda e: stats.power_two_sided(3, 0.0, e)) == 0.0


def _t_stats(n, sd, mean, null, reps=40000):
    """t statistics of ``reps`` simulated samples of n normal values against the null mean(s)."""
    x = np.random.default_rng(0).normal(mean, sd, size=(reps, n))
    m, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    return [(m - v) / se for v in null]


def test_power_of_one_sample_tests_matches_simulation():
    n, sd, b, alpha = 8, 0.033, math.log1p(0.03), 0.05
    one, two = sp.t.ppf(1 - alpha, n - 1), sp.t.ppf(1 - alpha / 2, n - 1)
    (t,) = _t_stats(n, sd, -b, [0.0])
    assert stats.power_one_sided(n, sd, b, alpha) == pytest.approx(np.mean(t < -one), abs=0.01)
    (t,) = _t_stats(n, sd, b, [0.0])
    assert stats.power_two_sided(n, sd, b, alpha) == pytest.approx(np.mean(abs(t) > two), abs=0.01)
    t_lo, t_hi = _t_stats(n, sd, 0.0, [-b, b])
    sim = float(np.mean((t_lo > one) & (t_hi < -one)))
    assert stats.power_tost(n, sd, b, 0.0, alpha) == pytest.approx(sim, abs=0.01)
    assert 0.35 < sim < 0.6  # the claims study's TOST: about a coin flip at a true ratio of exactly 1
    t_lo, t_hi = _t_stats(3, 0.0001, 0.0, [-b, b])  # a tiny sd: TOST all but always passes
    assert stats.power_tost(3, 0.0001, b, 0.0, alpha) == pytest.approx(1.0)
    assert np.mean((t_lo > 2.92) & (t_hi < -2.92)) > 0.99


def test_power_of_welch_matches_simulation():
    na, nb, sa, sb, effect, alpha = 3, 5, 0.08, 0.03, 0.15, 0.05
    rng = np.random.default_rng(1)
    a = rng.normal(effect, sa, size=(20000, na))
    b = rng.normal(0.0, sb, size=(20000, nb))
    p = sp.ttest_ind(a, b, axis=1, equal_var=False).pvalue
    p1 = sp.ttest_ind(a, b, axis=1, equal_var=False, alternative="greater").pvalue
    # the df of Welch's test varies with the sample sds; the power formula fixes it at the true sds
    assert stats.power_welch(na, sa, nb, sb, effect, alpha) == pytest.approx(np.mean(p < alpha), abs=0.03)
    assert stats.power_welch(na, sa, nb, sb, effect, alpha, "one") == pytest.approx(np.mean(p1 < alpha), abs=0.03)


def test_minimum_detectable_effect_has_80_percent_power():
    n, sd = 8, 0.033
    delta = stats.detectable(lambda e: stats.power_two_sided(n, sd, e))
    assert stats.power_two_sided(n, sd, delta) == pytest.approx(0.8, abs=1e-6)
    assert stats.power_two_sided(n, sd, 0.9 * delta) < 0.8
    assert stats.detectable(lambda e: stats.power_two_sided(32, sd, e)) < delta / 1.8  # more pairs, smaller
    welch = stats.detectable(lambda e: stats.power_welch(3, 0.05, 3, 0.05, e))
    assert stats.power_welch(3, 0.05, 3, 0.05, welch) == pytest.approx(0.8, abs=1e-6)
    assert math.isnan(stats.detectable(lambda e: stats.power_two_sided(2, 10.0, e)))  # not below hi = 1


def test_power_row_reads_the_declared_effect_and_its_mde():
    d = np.random.default_rng(1).normal(0.0, 0.033, 8)
    row = stats.power_row(d, "two-sided", 0.05, 0.03)
    sd_d = float(np.std(d, ddof=1))
    expect = 100 * math.expm1(stats.detectable(lambda e: stats.power_two_sided(8, sd_d, e)))
    assert row["mde80_pct"] == pytest.approx(expect) and row["sd"] == pytest.approx(sd_d)
    assert row["power"] == pytest.approx(stats.power_two_sided(8, sd_d, math.log1p(0.03)))
    assert math.isnan(stats.power_row(d[:1], "two-sided", 0.05, 0.03)["power"])


def test_compare_reports_the_p_of_the_null_each_test_names():
    d = np.log([0.95, 0.97, 0.96, 0.94, 0.955, 0.965])
    b = math.log1p(0.03)
    tost, ni = stats.compare(d, "tost", 0.05, 0.03), stats.compare(d, "noninferiority", 0.05, 0.03)
    assert tost["p_lower"] == pytest.approx(sp.ttest_1samp(d, -b, alternative="greater").pvalue, rel=1e-12)
    assert tost["p_upper"] == pytest.approx(sp.ttest_1samp(d, b, alternative="less").pvalue, rel=1e-12)
    assert tost["p"] == max(tost["p_lower"], tost["p_upper"]) and ni["p"] == ni["p_upper"]
    less, two = stats.compare(d, "less", 0.05), stats.compare(d, "two-sided", 0.05)
    assert less["p"] == pytest.approx(sp.ttest_1samp(d, 0.0, alternative="less").pvalue, rel=1e-12)
    assert two["p"] == pytest.approx(sp.ttest_1samp(d, 0.0).pvalue, rel=1e-12)
    assert two["decision"] == "A lower" and ni["decision"].startswith("non-inferior")
    assert tost["ci_low"] < tost["ci90_low"] < tost["ratio"] < tost["ci90_high"] < tost["ci_high"]
    assert stats.compare(d[:1], "two-sided", 0.05)["decision"] == "n < 2"


def test_delta_interval_uses_t_with_satterthwaite_df():
    # f = (ybar - a) / b with (a, b) from a fit on 6 df and ybar from 3 values (2 df)
    cov = np.array([[0.04, -0.01], [-0.01, 0.01]])
    a, b, ybar, var_ybar = 1.0, 0.5, 2.0, 0.003
    grad = [-1 / b, -(ybar - a) / b**2]
    v_fit = stats.delta_variance(grad, cov)
    assert v_fit == pytest.approx(grad[0] ** 2 * 0.04 + 2 * grad[0] * grad[1] * -0.01 + grad[1] ** 2 * 0.01)
    v_mean = var_ybar / b**2
    lo, hi, df = stats.delta_interval((ybar - a) / b, [v_fit, v_mean], [6, 2])
    assert df == pytest.approx((v_fit + v_mean) ** 2 / (v_fit**2 / 6 + v_mean**2 / 2))
    assert 2 < df < 8
    half = sp.t.ppf(0.975, df) * math.sqrt(v_fit + v_mean)
    assert (lo, hi) == pytest.approx((2 - half, 2 + half)) and half > 1.96 * math.sqrt(v_fit + v_mean)
    assert all(math.isnan(v) for v in stats.delta_interval(2.0, [v_fit, math.nan], [6, 2]))
    assert stats.delta_interval(2.0, [0.0], [3])[:2] == (2.0, 2.0)


def test_ols_slope_interval_and_h0_slope_0_match_scipy_linregress():
    x = np.log([65.7, 65.7, 84.1, 84.1, 102.6, 102.6, 127.1, 127.1])
    y = 0.6 * x + np.array([0.01, -0.02, 0.03, 0.0, -0.01, 0.02, -0.03, 0.01])
    line, ref = stats.ols_line(x, y), sp.linregress(x, y)
    assert (line.slope, line.intercept) == pytest.approx((ref.slope, ref.intercept), rel=1e-10)
    s = line.slope_t
    assert s.se == pytest.approx(ref.stderr, rel=1e-10) and s.df == 6
    assert s.p_h0_eq(0.0) == pytest.approx(ref.pvalue, rel=1e-8)
    t6 = sp.t.ppf(0.975, 6)
    assert s.interval() == pytest.approx((ref.slope - t6 * ref.stderr, ref.slope + t6 * ref.stderr), rel=1e-10)
    assert line.cov[0, 0] == pytest.approx(ref.intercept_stderr**2, rel=1e-10)


def test_ols_degenerate_fits():
    assert math.isnan(stats.ols_line([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]).slope)  # one distinct x
    two = stats.ols_line([0.0, 1.0], [1.0, 3.0])
    assert two.slope == pytest.approx(2.0) and math.isnan(two.slope_t.se) and math.isnan(two.slope_t.p_h0_eq(0))
    exact = stats.ols_line([0.0, 1.0, 2.0], [1.0, 3.0, 5.0]).slope_t  # every point on the line
    assert exact.se == pytest.approx(0.0, abs=1e-12)


def test_holm_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]  # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1, then running max
    assert stats.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.4]) == pytest.approx([0.8, 0.8])  # capped, monotone
    out = stats.holm([0.02, math.nan, 0.04])  # a test that did not run is not in the family
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert len(stats.holm([])) == 0


def test_binomial_h0_at_or_below_chance_and_fisher_match_scipy():
    assert stats.p_binomial_h0_le(30, 80, 0.25) == sp.binomtest(30, 80, 0.25, alternative="greater").pvalue
    assert stats.fisher_combined_p([0.1, 0.2]) == pytest.approx(sp.chi2.sf(-2 * math.log(0.02), 4))
    assert math.isnan(stats.fisher_combined_p([]))
