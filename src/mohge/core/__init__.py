"""Core: what every layer may use and that knows nothing of models, data or training.

Owns:
  `atomic`  atomic writes (a temporary sibling, then ``os.replace``), sha256 of files, the one-writer output lock
  `knobs`   strict loading of typed config sections (``knob``, ``from_dict``, ``ConfigError``) and their JSON schema
  `cli`     the conventions of the ``python -m mohge.<command>`` entry points: one-line refusals, exit codes
  `vocab`   the vocabularies several layers share (``BACKENDS``, ``PLACEMENTS``, ...)
  `resources`  the files shipped as package data (the lm-eval task definitions), found through importlib.resources
  `stats`   every interval, test, power and multiplicity adjustment of the studies (numpy and scipy.stats): the
            evaluation's token-level record and the analysis both read it

May import: nothing of mohge (this file imports nothing at all, so ``mohge.core.vocab`` stays free for
``mohge.kernels``).
"""
