"""``python -m mohge.train`` (also under ``torchrun ... -m mohge.train``): train one resolved run config."""

import os
import sys

from .runtime import exit_now
from .trainer import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a rank of torchrun: no interpreter teardown (exit_now)
    exit_now(code)
sys.exit(code)
