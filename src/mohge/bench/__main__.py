"""``python -m mohge.bench {layer,kernels,train,data,precision,peers}``."""

import sys

from . import main

sys.exit(main())
