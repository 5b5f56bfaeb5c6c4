"""``python -m mohge.utilization``: per-GPU utilization of expert placements (:mod:`mohge.analysis.utilization`)."""

import sys

from mohge.analysis.utilization import main

if __name__ == "__main__":
    sys.exit(main())
