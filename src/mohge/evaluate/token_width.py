"""The token-level Q3 record: each held-out token's routed width against its loss (docs/study.md).

The tracer (:mod:`mohge.evaluate.traces`) runs a model over every test token of graded data once; per position t
(which predicts target y_t, whose level it takes, as the trace's ``counts_by_level`` do) it keeps

    width_TL[t, l] = sum_k g_tk w(e_tk) / sum_k g_tk      (MoE layer l: gate-weighted mean width of the K experts
                                                           the token was routed to, in hidden units)
    width_T[t]     = mean_l width_TL[t, l]                 (the token's routed width: mean over MoE layers)
    loss_T[t]      = -log p(y_t | x_<=t)                   (cross-entropy of the next token, nats)

and summarises them (:func:`token_summary`, a few numbers that go into trace.json as ``token_q3``):

* ``answer`` / ``all``: Spearman's rho of width_T with loss_T over the answer tokens (positions whose target has a
  level) and over all tokens, against a shuffled baseline: ``n_perm`` permutations of the widths *within level*
  (separators, level -1, are one more stratum for ``all``). A within-level shuffle keeps the between-level part of
  rho (levels differ in both width and loss), so the null is centred there, not at 0; ``p`` is two-sided about the
  null's mean, (1 + #{|rho* - mean| >= |rho - mean|}) / (1 + n_perm) (:mod:`mohge.core.stats`, as every test
  here). ``rho_by_layer``: rho per MoE layer.
* ``within_token``: the same answer token at two levels. For every target token id that occurs at the easy and at
  the hard level, mean width_T at easy minus at hard; over those ids: mean, 95 % t CI, two-sided one-sample t p, n.
  Negative means easy tokens route narrower than the same token id in a hard sum (the study's sign, S4).

The per-token arrays (width_TL, loss_T, level_T, target_T) go beside the trace as ``<stem>_tokens.npz``, never into
results/. Legend: T tokens, L MoE layers, K top-k, E experts.
"""

from __future__ import annotations

import numpy as np

from mohge.config import LEVEL_NAMES
from mohge.core.stats import one_sample, spearman, stratified_permutation_test

N_PERM = 200
WIDTH_DEFINITION = "gate-weighted mean routed width (gates normalised per token and layer), mean over MoE layers"


def routed_width(idx_TK: np.ndarray, gates_TK: np.ndarray, widths_E: np.ndarray) -> np.ndarray:
    """[T] gate-weighted mean width of the experts each token was routed to in one layer."""
    g_TK = np.asarray(gates_TK, dtype=np.float64)
    w_TK = np.asarray(widths_E, dtype=np.float64)[np.asarray(idx_TK)]
    total_T = g_TK.sum(1)
    # a token whose gates are all 0 (possible only in theory): its plain mean width
    return np.where(total_T > 0, (g_TK * w_TK).sum(1) / np.where(total_T > 0, total_T, 1), w_TK.mean(1))


def within_token_contrast(width_T: np.ndarray, level_T: np.ndarray, target_T: np.ndarray, alpha: float = 0.05) -> dict:
    """Per target token id present at the easy and at the hard level: mean width at easy minus at hard; their mean,
    (1 - alpha) t interval, the two-sided one-sample t p of H0: mean 0, and count over ids (the degenerate cases as
    :mod:`mohge.core.stats` defines them)."""
    easy, hard = LEVEL_NAMES.index("easy"), LEVEL_NAMES.index("hard")
    diffs = []
    width_T, level_T, target_T = np.asarray(width_T), np.asarray(level_T), np.asarray(target_T)
    for tok in np.intersect1d(target_T[level_T == easy], target_T[level_T == hard]):
        mine = target_T == tok
        diffs.append(width_T[mine & (level_T == easy)].mean() - width_T[mine & (level_T == hard)].mean())
    est = one_sample(diffs)
    low, high = est.interval(alpha)
    return {"n_ids": est.n, "easy_minus_hard": est.estimate, "low": low, "high": high, "p": est.p_h0_eq(0.0)}


def token_summary(
    width_TL: np.ndarray, loss_T: np.ndarray, level_T: np.ndarray, target_T: np.ndarray, n_perm: int = N_PERM
) -> dict:
    """The ``token_q3`` block of a trace (module docstring): small, JSON-ready."""
    width_TL = np.asarray(width_TL, dtype=np.float64).reshape(len(loss_T), -1)
    width_T, loss_T, level_T = width_TL.mean(1), np.asarray(loss_T, dtype=np.float64), np.asarray(level_T)
    answer = level_T >= 0

    def block(sel: np.ndarray) -> dict:
        out = stratified_permutation_test(width_T[sel], loss_T[sel], level_T[sel], n_perm)
        out["rho_by_layer"] = [spearman(width_TL[sel, i], loss_T[sel]) for i in range(width_TL.shape[1])]
        return out

    mean_width = {
        name: float(width_T[level_T == lv].mean()) for lv, name in enumerate(LEVEL_NAMES) if (level_T == lv).any()
    }
    return _json_ready(
        {
            "width": WIDTH_DEFINITION,
            "n_tokens": int(len(loss_T)),
            "mean_width": mean_width,
            "answer": block(answer),
            "all": block(np.ones(len(loss_T), dtype=bool)),
            "within_token": within_token_contrast(width_T[answer], level_T[answer], np.asarray(target_T)[answer]),
        }
    )


def _json_ready(value):
    """nan -> None (strict JSON has no NaN), recursively."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return None if isinstance(value, float) and value != value else value
