"""lm-eval's own command line, with the ``mohge`` model registered (``lm_eval`` alone does not import mohge).

    python -m mohge.evaluate build-tasks --data data/<source> --out mohge_tasks
    python -m mohge.lm_eval --model mohge --model_args pretrained=results/<run>/model --device cpu \
        --include_path configs/tasks --tasks mohge_ppl,mohge_cloze --metadata '{"task_data": "mohge_tasks"}'

Every flag is lm-eval's (``python -m mohge.lm_eval --help``); ``--model mohge`` is the adapter
``mohge.evaluate.lm_eval_adapter.MoHGELM`` (its ``model_args``: pretrained, device, batch_size, max_batch_size,
max_gen_toks, max_length, tokenizer, precision). The same tasks run on the exported Hugging Face model
(``python -m mohge.hf_export``) with lm-eval alone, with equal scores:
``lm_eval --model hf --model_args pretrained=HF_DIR,trust_remote_code=True ...``.
A user mistake (an unknown model argument, a missing task file) is one line and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mohge.core.cli import user_errors


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_adapter  # noqa: F401  (registers the model "mohge")

    saved = sys.argv
    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
