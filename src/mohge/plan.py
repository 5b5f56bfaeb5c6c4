"""``python -m mohge.plan``: memory and throughput of a cluster config before it runs (:mod:`mohge.analysis.plan`)."""

import sys

from mohge.analysis.plan import main

if __name__ == "__main__":
    sys.exit(main())
