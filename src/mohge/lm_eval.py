"""``python -m mohge.lm_eval``: lm-eval's command line, ``--model mohge`` registered (:mod:`mohge.evaluate.harness`)."""

import sys

from mohge.evaluate.harness import main

if __name__ == "__main__":
    sys.exit(main())
