"""The model: the MoHGE transformer and every baseline family, read like the paper (docs/method.md §1-§9).

Owns, in reading order:
  `experts`      the bias-free SwiGLU expert and the routed experts of several widths (dispatch: mohge.kernels)
  `routing`      the two-level group router and the flat top-k router (§2)
  `losses`       the Group-Wise and Intra-Group aux losses, the Switch and size-weighted balance losses (§5)
  `moe`          the MoE layer of every family (:class:`MoELayer`), MoHGE's layer as a block of one's own model
                 (:class:`MoHGELayer`, docs/api.md), the routing summary of the routed slots (§1.3)
  `transformer`  the decoder-only LM (:class:`LanguageModel`, re-exported here) (§1.4)
  `allocation`   where the experts live: the placements of expert parallelism (§4)
  `params`       total and activated parameter counts (§9; ``python -m mohge.params``)

May import: :mod:`mohge.core`, :mod:`mohge.config` and :mod:`mohge.kernels`; never :mod:`mohge.data` (its
sibling) or anything above (train, evaluate, analysis, bench).
"""

from .losses import weighted_aux
from .moe import MoELayer, MoHGELayer
from .transformer import LanguageModel

__all__ = ["LanguageModel", "MoELayer", "MoHGELayer", "weighted_aux"]
