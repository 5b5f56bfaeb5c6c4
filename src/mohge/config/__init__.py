"""Configuration of one run: typed, strictly loaded sections, the matched baselines, and the checks a run needs
before it starts.

Owns:
  `sections`   one frozen dataclass per component (ModelConfig, FFNConfig, RouterConfig, LossConfig, TrainConfig,
               ParallelConfig, EvalConfig) and the resolved RunConfig (docs/method.md; ``python -m mohge.train``
               reads only that file)
  `data`       the ``data`` section (DataConfig) and the data vocabularies (splits, sources, graded levels, EOT)
  `matched`    the matched baselines' model configs derived from the MoHGE config (docs/method.md §8)
  `preflight`  what a run needs from the world (files, tasks, device, hub), checked at plan time and at start

May import: :mod:`mohge.core` only (the layer rule: ``mohge/__init__.py``). The names below are re-exported so
``from mohge.config import RunConfig, ...`` is the one import of a config for every layer above.
"""

from mohge.core.knobs import ConfigError, check_name, from_dict, load_yaml_or_json, to_dict
from mohge.core.vocab import (
    AC_MODES,
    ADAMW_IMPLS,
    ATTENTION_KINDS,
    BACKENDS,
    DATA_ORDERS,
    DEVICES,
    EXPERT_AUX_MODES,
    FFN_KINDS,
    FLAT_GATES,
    GATE_MODES,
    PLACEMENTS,
    PRECISIONS,
    SCORE_FUNCTIONS,
)

from .data import (
    DATA_SOURCES,
    DESIGNS,
    EOT,
    LEVEL_NAMES,
    MIN_VOCAB_SIZE,
    SHAKESPEARE_SHA256,
    SPLITS,
    SUM_DIGITS,
    DataConfig,
)
from .sections import (
    EvalConfig,
    FFNConfig,
    LossConfig,
    ModelConfig,
    ParallelConfig,
    RouterConfig,
    RunConfig,
    TrainConfig,
    load_model_config,
    load_run_config,
)

__all__ = [
    "AC_MODES",
    "ATTENTION_KINDS",
    "ADAMW_IMPLS",
    "BACKENDS",
    "DATA_ORDERS",
    "DATA_SOURCES",
    "DESIGNS",
    "DEVICES",
    "EOT",
    "EXPERT_AUX_MODES",
    "FFN_KINDS",
    "FLAT_GATES",
    "GATE_MODES",
    "LEVEL_NAMES",
    "MIN_VOCAB_SIZE",
    "PLACEMENTS",
    "PRECISIONS",
    "SCORE_FUNCTIONS",
    "SHAKESPEARE_SHA256",
    "SPLITS",
    "SUM_DIGITS",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "FFNConfig",
    "LossConfig",
    "ModelConfig",
    "ParallelConfig",
    "RouterConfig",
    "RunConfig",
    "TrainConfig",
    "check_name",
    "from_dict",
    "load_model_config",
    "load_run_config",
    "load_yaml_or_json",
    "to_dict",
]
