"""``python -m mohge.evaluate``: lm-eval and the held-out loss of a trained model (:mod:`mohge.evaluate.suite`)."""

import sys

from .suite import main

sys.exit(main())
