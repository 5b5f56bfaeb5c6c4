"""Documents of the local mohge tasks, for lm-eval's ``custom_dataset`` (each YAML here names ``load``).

The documents are the jsonl files that ``python -m mohge.evaluate build-tasks --data DATA --out DIR`` writes.
lm-eval finds them in the folder given as ``--metadata '{"task_data": "DIR"}'`` (a relative DIR is taken from
the working directory) or, without it, in ``./mohge_tasks`` of the working directory::

    python -m mohge.evaluate build-tasks --data data/<source> --ckpt MODEL --out mohge_tasks
    lm_eval --model hf --model_args pretrained=HF_DIR,trust_remote_code=True,logits_cache=False --device cpu \
        --include_path src/mohge/tasks --tasks mohge_ppl,mohge_cloze [--metadata '{"task_data": "mohge_tasks"}']

``--ckpt MODEL`` (or ``--max-length N``) builds the documents for the model's context: a choice document is kept
only when every choice fits in it, so lm-eval's ``hf`` model and our ``mohge`` model score the same documents
whole. ``python -m mohge.evaluate`` passes its own task folder the same way. The rows become an in-memory dataset:
no download and no cache folder, so the tasks run offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

from mohge.core.knobs import ConfigError

DEFAULT_TASK_DATA = "mohge_tasks"


def load(task_file: str, task_data: str = DEFAULT_TASK_DATA, **_metadata: Any) -> datasets.DatasetDict:
    """The rows of ``task_data/task_file`` as the ``train`` split (the split every local task tests on)."""
    path = Path(task_data) / task_file
    if not path.is_file():
        raise ConfigError(
            f"task_data={task_data}: {path} is missing (write the task documents with `python -m mohge.evaluate "
            f"build-tasks --data DATA --ckpt MODEL --out {task_data}`, or pass --metadata "
            f'\'{{"task_data": "DIR"}}\'; a task none of whose documents fits the model\'s context has no file)'
        )
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})
