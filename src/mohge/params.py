"""``python -m mohge.params``: total and activated parameters of a model config (:mod:`mohge.model.params`)."""

import sys

from mohge.model.params import main

if __name__ == "__main__":
    sys.exit(main())
