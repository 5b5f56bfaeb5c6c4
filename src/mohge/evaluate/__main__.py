"""``python -m mohge.evaluate``: lm-eval and the held-out loss of a trained model (:mod:`mohge.evaluate.metrics`)."""

import sys

from .metrics import main

sys.exit(main())
