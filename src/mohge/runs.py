"""``python -m mohge.runs``: the experiment plan and the workflow config's JSON schema (:mod:`mohge.config.runs`)."""

import sys

from mohge.config.runs import main

if __name__ == "__main__":
    sys.exit(main())
