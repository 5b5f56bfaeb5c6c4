"""``python -m mohge.provenance``: which code made the committed results (:mod:`mohge.config.provenance`)."""

import sys

from mohge.config.provenance import main

if __name__ == "__main__":
    sys.exit(main())
