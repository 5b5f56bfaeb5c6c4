"""``python -m mohge.hf_export``: a trained folder as a Hugging Face model (:mod:`mohge.evaluate.hf_export`)."""

import sys

from mohge.evaluate.hf_export import main

if __name__ == "__main__":
    sys.exit(main())
