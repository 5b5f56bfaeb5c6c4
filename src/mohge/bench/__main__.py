"""``python -m mohge.bench {layer,kernels,train,data}``."""

import sys

from . import main

sys.exit(main())
