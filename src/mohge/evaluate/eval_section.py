"""Which eval section an evaluation of a trained model folder reads (``mohge evaluate``, ``mohge traces``).

A model folder's own config.json holds what training needs; its eval section is the default one (the workflow keeps
the study's eval section out of training, so that an eval-only change re-evaluates without retraining). The workflow
evaluates each run with the study's: ``results/<study>/runs/<run>/config.json``, passed as ``--eval-config``. So the
eval section is, in order:

1. ``--eval-config FILE``: that run config's;
2. for a folder ``work/<study>/runs/<run>`` (what the train rule writes) with ``results/<study>/runs/<run>/config.json``
   beside it, of the same run: the study's, as the workflow evaluates the run, so the numbers are its metrics.json's;
3. the model folder's own.

The command logs which one it reads.
"""

from __future__ import annotations

from pathlib import Path

from mohge.config import RunConfig, load_run_config


def study_run_config(ckpt: str | Path) -> Path | None:
    """``results/<study>/runs/<run>/config.json`` for a model folder ``work/<study>/runs/<run>``, when it exists."""
    parts = Path(ckpt).parts
    if len(parts) < 4 or parts[-2] != "runs" or parts[-4] != "work":
        return None
    found = Path(*parts[:-4], "results", parts[-3], "runs", parts[-1], "config.json")
    return found if found.is_file() else None


def eval_run_config(ckpt: str | Path, eval_config: str | Path | None, model_cfg: RunConfig) -> tuple[RunConfig, str]:
    """(run config whose eval section the evaluation reads, where it comes from): see the module docstring.
    ``model_cfg`` is the model folder's own config."""
    if eval_config is not None:
        return load_run_config(eval_config), f"{eval_config} (--eval-config)"
    study = study_run_config(ckpt)
    if study is not None:
        cfg = load_run_config(study)
        if cfg.name == model_cfg.name:
            return cfg, f"{study} (the study's, as the workflow evaluates run {cfg.name}; --eval-config for another)"
    own = Path(ckpt) / "config.json"
    return model_cfg, f"{own} (the model folder's own: its defaults; --eval-config RUN_CONFIG for a study's)"
