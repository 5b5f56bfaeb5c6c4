"""mohge: Mixture of Heterogeneous Grouped Experts (arXiv 2604.23108), a reproducible artifact.

Subpackages, one per subsystem, lowest layer first:

  core      atomic writes and locks, strict config loading, CLI conventions, shared vocabularies
  config    the typed config sections of a run, the matched baselines, preflight checks, parameter counts
  model     the MoHGE transformer and every baseline family (routing, losses, experts, placement, counts)
  data      sources -> documents -> tokenizer -> token shards, and the batches read from them
  train     the training loop and its step, checkpoints, and the parallel stack (train/distributed)
  evaluate  lm-eval tasks and the adapter, held-out metrics, routing traces, the Hugging Face export

The layer rule: a module imports only its own subpackage and the layers listed before it; ``model`` and ``data``
are siblings and never import each other; no import circle, imports inside functions included
(tests/unit/test_layout.py checks every import). ``mohge.kernels`` lives in the top-level ``kernels/`` folder
(the install maps it there, pyproject.toml's package-dir), sits below ``model`` and imports nothing of mohge but
``mohge.core.vocab``. What runs the paper's studies (the workflow's plan, the analysis and the benchmarks) is the
package ``mohge_studies`` in the top-level ``studies/`` folder, which imports this one and never the other way.
The modules directly in this folder are the commands that keep their names (``mohge traces`` ...), each a few lines
calling its subsystem's ``main``.

The layer API (docs/api.md) is importable from here: ``from mohge import MoHGELayer`` (also ``MoELayer`` and
``weighted_aux``). It is :mod:`mohge.model`'s, imported on first use, so that ``import mohge`` (which every
``mohge <command>`` runs) imports nothing.
"""

__version__ = "0.1.0"

_LAYER_API = ("MoELayer", "MoHGELayer", "weighted_aux")
__all__ = ["__version__", *_LAYER_API]


def __getattr__(name: str):
    if name in _LAYER_API:
        from mohge import model

        return getattr(model, name)
    raise AttributeError(f"module 'mohge' has no attribute {name!r}")
