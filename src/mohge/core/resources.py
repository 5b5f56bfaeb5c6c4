"""Files the package ships beside its code (package data, pyproject.toml's package-data), found through
importlib.resources, so that a regular install finds them where a checkout does.

  `TASKS`  the lm-eval task definitions (mohge/tasks): one YAML per local task, ``standard.yaml`` (the hub tasks
           a config may name), ``mohge_task_data.py`` (the documents' loader, which lm-eval imports from there)

The package is installed as files (a wheel unpacked, or editable), so each is a real folder that lm-eval's
``include_path`` can read.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

TASKS = Path(str(resources.files("mohge").joinpath("tasks")))
