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

import argparse
import contextlib
import inspect
import sys
from collections.abc import Iterator, Sequence

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
The shipped task definitions are included unless --include_path names a folder. Where every task that --tasks
names is defined there, lm-eval's built-in task definitions are not indexed (they are not needed to run it).
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
        with _builtin_tasks_indexed(asks_help or not _own_tasks_only(args)):
            cli_evaluate()
    finally:
        sys.argv = saved
    return 0


def _own_tasks_only(args: Sequence[str]) -> bool:
    """Whether every task that ``--tasks`` names is defined under ``--include_path`` (lm-eval's own index of that
    folder alone), so that the run needs none of lm-eval's built-in tasks. False where ``--tasks`` is absent or
    spelled otherwise, where ``--config`` may name more tasks, for lm-eval's other commands (``ls``, ``validate``)
    and for a task given as a file or folder: lm-eval then indexes its built-in tasks as it always does."""
    if args and args[0] in ("ls", "validate"):
        return False
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--tasks", "-t", nargs="+")
    p.add_argument("--include_path")
    p.add_argument("--config", "-C")
    known, _ = p.parse_known_args(list(args))
    names = [n.strip() for v in known.tasks or [] for n in v.split(",") if n.strip()]
    if not names or known.config or not known.include_path:
        return False
    from lm_eval.tasks import TaskManager

    index = set(TaskManager(include_path=known.include_path, include_defaults=False).all_tasks)
    return all(n in index for n in names)


@contextlib.contextmanager
def _builtin_tasks_indexed(indexed: bool) -> Iterator[None]:
    """lm-eval's ``TaskManager`` indexes its built-in task files (thousands of YAML files) unless it is built with
    ``include_defaults=False``, which lm-eval's command line never passes; inside this context, where ``indexed`` is
    False, that argument's default is False. Where lm-eval's signature has no such argument, nothing changes."""
    from lm_eval.tasks import TaskManager

    init = TaskManager.__init__
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    names = [n for n, q in inspect.signature(init).parameters.items() if q.kind is positional and n != "self"]
    if indexed or "include_defaults" not in names or init.__defaults__ is None:
        yield
        return
    saved = init.__defaults__
    params = names[len(names) - len(saved) :]  # the parameters that have defaults, in order
    init.__defaults__ = tuple(False if n == "include_defaults" else v for n, v in zip(params, saved, strict=True))
    try:
        yield
    finally:
        init.__defaults__ = saved
