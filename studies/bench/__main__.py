"""``python -m mohge_studies.bench {layer,kernels,train,data,precision,eval,inference,peers,profile,compile}``."""

import sys

from . import main

sys.exit(main())
