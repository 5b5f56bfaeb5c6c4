"""``python -m mohge.bench {layer,kernels,train,data,precision}``."""

import sys

from . import main

sys.exit(main())
