"""lm-eval's own command line, with the ``mohge`` model registered (``lm_eval`` alone does not import mohge).

    python -m mohge.evaluate build-tasks --data data/<source> --ckpt results/<run>/model --out mohge_tasks
    mohge lm-eval --model mohge --model_args pretrained=results/<run>/model --device cpu \
        --tasks mohge_ppl,mohge_cloze --metadata '{"task_data": "mohge_tasks"}'

Every flag is lm-eval's (``mohge lm-eval --help``); without ``--include_path`` the shipped task definitions
(``mohge/tasks``, mohge.core.resources.TASKS) are included; ``--model mohge`` is
``mohge.evaluate.lm_eval_adapter.MoHGELM`` (its ``model_args``: pretrained, device, batch_size, max_batch_size,
max_gen_toks, max_length, tokenizer, precision or HFLM's name dtype); ``--help`` says so before lm-eval's own help.
The same tasks run on the exported Hugging Face model (``mohge export``) with lm-eval alone, with equal
scores:
``lm_eval --model hf --model_args pretrained=HF_DIR,trust_remote_code=True,logits_cache=False ...`` (README).
A user mistake (an unknown model argument, a missing task file) is one line and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mohge.core.cli import user_errors
from mohge.core.resources import TASKS

MODEL_HELP = """mohge lm-eval: lm-eval's command line with the model `mohge` registered
(mohge.evaluate.lm_eval_adapter.MoHGELM, a trained model folder of python -m mohge.train):

  mohge lm-eval --model mohge --model_args pretrained=MODEL_DIR[,KEY=VALUE...] --device cpu \\
      --tasks mohge_ppl,mohge_cloze --metadata '{"task_data": "mohge_tasks"}'

model_args of `mohge` (any other is refused):
  pretrained        the trained model folder (model.safetensors, config.json, tokenizer.json); required
  device            auto (default: CUDA when present), cpu, cuda, cuda:N; CUDA without CUDA falls back to the CPU
  batch_size        sequences per forward pass (default 16; auto / auto:N = 16), also --batch_size
  max_batch_size    cap for batch_size=auto
  max_gen_toks      new tokens of generate_until at most (default 256)
  max_length        context in tokens (default: the trained one, min(data.seq_len, model.max_seq_len))
  tokenizer         tokenizer.json to use instead of the folder's
  precision         auto (bf16 on CUDA, else fp32), fp32, bf16
  dtype             HFLM's name for precision: auto, float32, bfloat16 (also fp32, bf16)
  trust_remote_code accepted and ignored (no remote code)
  share_context     true (default): every distinct prefix of the requests runs once (a prefix tree packed in
                    rows); false: every request scored whole (the same scores, to rounding)

Task documents: mohge evaluate build-tasks --data DATA --ckpt MODEL_DIR --out mohge_tasks
The shipped task definitions are included unless --include_path names a folder.
Everything else is lm-eval's own command line, whose help follows.
"""


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    asks_help = any(a in ("-h", "--help") for a in args) or not args
    if asks_help:
        print(MODEL_HELP)
        sys.stdout.flush()
    from lm_eval.__main__ import cli_evaluate

    from . import lm_eval_adapter  # noqa: F401  (registers the model "mohge")

    if not asks_help and not any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(TASKS)]
    saved = sys.argv
    sys.argv = ["lm_eval", *args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0
