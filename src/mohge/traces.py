"""``python -m mohge.traces``: the routing trace of a trained model on held-out data (:mod:`mohge.evaluate.traces`)."""

import sys

from mohge.evaluate.traces import main

if __name__ == "__main__":
    sys.exit(main())
