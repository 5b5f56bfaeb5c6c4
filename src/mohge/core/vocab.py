"""The vocabularies several layers share: the allowed values of the config's string knobs, defined once.

Dependency-free on purpose: ``mohge.config`` declares its knobs with them (and re-exports them), and
``mohge.kernels``, which may import nothing else of mohge, checks its ``backend`` argument against
:data:`BACKENDS`.
"""

FFN_KINDS = ("dense", "moe", "mohge", "hmoe", "modse")
GATE_MODES = ("code_exact", "product_renorm")
FLAT_GATES = ("logits", "probs")  # the flat router's gate: softmax over the top-k logits, or over their probabilities
SCORE_FUNCTIONS = ("sigmoid", "softmax")
PLACEMENTS = ("contiguous", "all_size", "modse_pairs", "flop_lpt")
ATTENTION_KINDS = ("mha", "mla")
BACKENDS = ("auto", "triton", "grouped_mm", "torch", "loop")
EXPERT_AUX_MODES = ("code", "per_group")
BALANCE_STATS = ("micro_batch", "global_batch")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
DATA_ORDERS = ("random", "sequential")
AC_MODES = ("none", "block")  # train.parallel.activation_checkpointing
