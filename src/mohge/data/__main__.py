"""`python -m mohge.data`: prepare a data source (mohge.data.prepare.main)."""

from .prepare import main

if __name__ == "__main__":
    raise SystemExit(main())
