"""``python -m mohge <command>``: the ``mohge`` command (mohge.cli) where its script is not on PATH."""

from mohge.cli import main

raise SystemExit(main())
