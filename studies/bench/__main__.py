"""``python -m mohge_studies.bench <what>``: the same command as ``mohge bench <what>``."""

import sys

from . import main

sys.exit(main())
