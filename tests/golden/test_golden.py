"""The golden loss curve (golden_curve.py): a silent change of the training math fails here.

Exact float equality on the torch build and CPU kind the record was made on (two runs there give identical
bits); elsewhere, where vectorised kernels may round differently, a relative 1e-4. A 1% change of
``expert_aux_coeff`` moves the curve by 0.76% at worst; a 1% change of ``group_aux_coeff`` by 2e-7, caught
only by the exact comparison.
"""

from __future__ import annotations

import math

from golden_curve import CONFIG, GOLDEN, REGEN, environment, read_golden, run_curve

FOREIGN_RTOL = 1e-4


def _first_difference(got: list[dict], want: list[dict], rtol: float) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} steps, the record has {len(want)}"
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        for key in w:
            same = g[key] == w[key] if rtol == 0 else math.isclose(g[key], w[key], rel_tol=rtol)
            if not same:
                return f"step {step} {key}: {g[key]!r}, recorded {w[key]!r}"
    return None


def test_golden_loss_curve():
    record = read_golden()
    assert record["config"] == CONFIG, f"the golden config changed without a new record: run `{REGEN}`"
    rtol = 0.0 if record["environment"] == environment() else FOREIGN_RTOL
    diff = _first_difference(run_curve(), record["steps"], rtol)
    assert diff is None, (
        f"the training math changed ({diff}; compared {'exactly' if rtol == 0 else f'at rtol {rtol}'} against "
        f"{GOLDEN.name}). If the change is meant to alter the math, regenerate the record with `{REGEN}` and commit it."
    )
