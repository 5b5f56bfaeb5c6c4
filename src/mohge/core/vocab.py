"""The vocabularies several layers share: the allowed values of the config's string knobs, defined once.

Dependency-free on purpose: ``mohge.config`` declares its knobs with them (and re-exports them), and
``mohge.kernels``, which may import nothing else of mohge, checks its ``backend`` argument against
:data:`BACKENDS`.
"""

FFN_KINDS = ("dense", "moe", "mohge", "hmoe", "modse")
# MoHGE's final gates (docs/method.md §2.4): a softmax over the top-k *probabilities* (Megatron's, the release's),
# or the top-k products renormalised to sum to 1
GATE_MODES = ("softmax_topk_probs", "product_renorm")
FLAT_GATES = ("logits", "probs")  # the flat router's gate: softmax over the top-k logits, or over their probabilities
SCORE_FUNCTIONS = ("sigmoid", "softmax")
PLACEMENTS = ("contiguous", "all_size", "modse_pairs", "flop_lpt")
ATTENTION_KINDS = ("mha", "mla")
BACKENDS = ("auto", "triton", "grouped_mm", "torch", "loop")
# L_E (docs/method.md §5.2): the release's over all experts with the sparse final gates and N_eff scaling, or within
# each group
EXPERT_AUX_MODES = ("all_experts_sparse", "per_group")
BALANCE_STATS = ("micro_batch", "global_batch")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
DATA_ORDERS = ("random", "sequential")
ADAMW_IMPLS = ("auto", "foreach", "fused")  # train.adamw
AC_MODES = ("none", "block")  # train.parallel.activation_checkpointing

# Aliases accepted for a value, each -> its name above (committed run configs and exported models spell them so);
# a config is normalised to the name above when it is read (mohge.core.knobs: ``knob(aliases=...)``)
GATE_MODE_ALIASES = {"code_exact": "softmax_topk_probs"}
EXPERT_AUX_MODE_ALIASES = {"code": "all_experts_sparse"}
