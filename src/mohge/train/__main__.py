"""``python -m mohge.train`` (also under ``torchrun ... -m mohge.train``): train one resolved run config."""

import sys

from .trainer import main

sys.exit(main())
