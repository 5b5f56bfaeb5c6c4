"""Regenerate the golden loss curve after a change that is meant to alter the training math.

    python tests/golden/regen.py

Writes tests/golden/tiny_mohge.json; commit it with the change, saying why the curve moved.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # golden_curve.py beside this script, run as a file

from golden_curve import GOLDEN, run_curve, write_golden  # noqa: E402

if __name__ == "__main__":
    rows = run_curve()
    write_golden(rows)
    print(f"wrote {GOLDEN} ({len(rows)} steps, final loss {rows[-1]['loss']:.6f})")
