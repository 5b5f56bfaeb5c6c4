"""``python -m mohge.collect``: the per-run summaries gathered into tables (:mod:`mohge.analysis.collect`)."""

import sys

from mohge.analysis.collect import main

if __name__ == "__main__":
    sys.exit(main())
