"""``python -m mohge.study``: the paired tests and claims of the study (:mod:`mohge.analysis.study`)."""

import sys

from mohge.analysis.study import main

if __name__ == "__main__":
    sys.exit(main())
