"""Typed, strictly loaded configuration: one dataclass per component, one resolved file per run.

Every section is a frozen dataclass whose fields are declared once with :func:`mohge.core.knobs.knob` (default,
description, allowed values), so a bad config fails before anything is built, with a one-line message that
names the key (as a dotted path such as ``model.ffn.group_topk``) and the value, and the JSON schema of the
workflow (``mohge runs schema``) says the same. Each constructor receives only its own section
(``MoELayer`` gets ``FFNConfig``, ``RouterConfig`` and ``LossConfig``, the trainer gets ``TrainConfig``, ...).

The MoHGE-specific fields follow the official release (docs/method.md); its ambiguities are switches:
``RouterConfig.gate_mode``, ``LossConfig.group_cost_interval`` / ``group_cost_weights``,
``LossConfig.group_aux_start_frac`` and ``LossConfig.expert_aux_mode``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mohge.core.knobs import (
    _coerce,
    _fail,
    _Section,
    check_name,
    knob,
    load_yaml_or_json,
)
from mohge.core.vocab import (
    AC_MODES,
    ADAMW_IMPLS,
    ATTENTION_KINDS,
    BACKENDS,
    BALANCE_STATS,
    DATA_ORDERS,
    DEVICES,
    EXPERT_AUX_MODE_ALIASES,
    EXPERT_AUX_MODES,
    FFN_KINDS,
    FLAT_GATES,
    GATE_MODE_ALIASES,
    GATE_MODES,
    PLACEMENTS,
    PRECISIONS,
    SCORE_FUNCTIONS,
)

from .data import DataConfig


@dataclass(frozen=True)
class FFNConfig(_Section):
    """The feed-forward block of every MoE layer: which family, how many experts, which widths.

    Experts come in ``len(expert_widths)`` width classes of ``num_experts / len(expert_widths)`` experts
    each, in class-major order. For ``mohge`` the classes are the router's groups (docs/method.md);
    ``moe`` has one class; ``hmoe`` and ``modse`` have several classes under a flat router.
    """

    kind: str = knob("mohge", "model family of the FFN block", choices=FFN_KINDS)
    num_experts: int = knob(64, "routed experts per MoE layer", gt=0)
    expert_widths: tuple[int, ...] = knob(
        (384, 512, 640, 768, 896, 1024, 1152, 1280), "hidden width of each width class (group)", gt=0, min_items=1
    )
    shared_expert_width: int = knob(2048, "hidden width of the always-on shared expert (0: none)", ge=0)
    dense_layers: int = knob(1, "leading layers with a dense FFN instead of experts", ge=0)
    dense_width: int = knob(6144, "hidden width of a dense FFN", gt=0)
    placement: str = knob("all_size", "how experts are laid out over expert-parallel ranks", choices=PLACEMENTS)
    ep_size: int = knob(1, "expert-parallel ranks the placement plans for", gt=0)
    backend: str = knob(
        "auto",
        "expert compute: Triton kernels, F.grouped_mm per width class, grouped torch, or a per-expert loop",
        choices=BACKENDS,
    )
    _path: str = field(default="", repr=False, compare=False)

    @property
    def num_groups(self) -> int:
        return len(self.expert_widths)

    @property
    def experts_per_group(self) -> int:
        return self.num_experts // self.num_groups

    @property
    def per_expert_widths(self) -> tuple[int, ...]:
        """Width of every expert in class-major (router) order."""
        return tuple(w for w in self.expert_widths for _ in range(self.experts_per_group))

    def check(self) -> None:
        if self.kind == "dense":
            return
        G = self.num_groups
        if self.num_experts % G:
            _fail(
                self.key("num_experts"),
                self.num_experts,
                f"must be divisible by the number of groups len(expert_widths)={G}",
            )
        if self.kind == "moe" and G != 1:
            _fail(self.key("expert_widths"), self.expert_widths, "a homogeneous moe takes exactly one width")
        if self.kind in ("hmoe", "modse") and G < 2:
            _fail(self.key("expert_widths"), self.expert_widths, f"{self.kind} needs >= 2 distinct widths")
        if self.num_experts % self.ep_size:
            _fail(self.key("ep_size"), self.ep_size, f"must divide num_experts={self.num_experts}")
        if self.placement in ("all_size", "modse_pairs"):
            self._check_symmetric()
        if self.placement == "all_size" and self.ep_size > 1:
            per_rank = self.num_experts // self.ep_size
            if per_rank % 2 and per_rank % G:
                _fail(
                    self.key("ep_size"),
                    self.ep_size,
                    f"all_size allocation needs num_experts/ep_size (={per_rank}) even or a multiple of G={G}",
                )
        if self.placement == "modse_pairs" and (self.num_experts // self.ep_size) % 2:
            _fail(self.key("ep_size"), self.ep_size, "modse_pairs needs an even number of experts per rank")

    def _check_symmetric(self) -> None:
        """All-size allocation and MoDSE pairs need even G and widths symmetric around their mean."""
        G, ws = self.num_groups, sorted(self.expert_widths)
        if G % 2:
            _fail(self.key("expert_widths"), self.expert_widths, f"{self.placement} placement needs an even G")
        if len({ws[i] + ws[G - 1 - i] for i in range(G // 2)}) != 1:
            _fail(
                self.key("expert_widths"),
                self.expert_widths,
                f"{self.placement} placement needs widths symmetric around their mean "
                "(w_min + w_max = w_2nd + w_2nd-last = ...)",
            )


@dataclass(frozen=True)
class RouterConfig(_Section):
    """Routing: MoHGE's two-level router (docs/method.md) and the flat top-k router of the baselines."""

    topk: int = knob(6, "experts each token is routed to", gt=0)
    group_topk: int = knob(4, "groups each token may pick experts from (MoHGE)", gt=0)
    group_score: str = knob("sigmoid", "score function of the group router", choices=SCORE_FUNCTIONS)
    gate_mode: str = knob(
        "softmax_topk_probs",
        "how the two levels' scores combine into gates: softmax over the top-k probabilities, or their renormalised "
        "products (docs/method.md §2.4)",
        choices=GATE_MODES,
        aliases=GATE_MODE_ALIASES,
    )
    flat_gate: str = knob(
        "logits",
        "the flat router's gate (moe, hmoe, modse; MoHGE's is gate_mode): softmax over top-k logits or probabilities",
        choices=FLAT_GATES,
    )
    init_std: float = knob(0.008, "init std of the router weights", gt=0)
    expert_bias_rate: float = knob(
        0.0,
        "u: step of the per-expert selection bias that balances experts without a loss (0: off; docs/method.md §5.6)",
        ge=0,
    )
    group_bias_rate: float = knob(
        0.0,
        "u_G: step of the per-group selection bias that keeps every group selected without a loss (0: off; "
        "docs/method.md §5.7)",
        ge=0,
    )
    _path: str = field(default="", repr=False, compare=False)

    def check_against(self, ffn: FFNConfig) -> None:
        """Cross-checks that need the FFN section (called by ModelConfig)."""
        if ffn.kind == "dense":
            return
        if self.expert_bias_rate and ffn.kind != "mohge":
            _fail(self.key("expert_bias_rate"), self.expert_bias_rate, "is MoHGE's intra-group balance (kind mohge)")
        if self.group_bias_rate and ffn.kind != "mohge":
            _fail(self.key("group_bias_rate"), self.group_bias_rate, "is MoHGE's group balance (kind mohge)")
        if ffn.kind == "mohge":
            if self.group_topk > ffn.num_groups:
                _fail(self.key("group_topk"), self.group_topk, f"exceeds the number of groups G={ffn.num_groups}")
            reachable = self.group_topk * ffn.experts_per_group
            if self.topk > reachable:
                _fail(
                    self.key("topk"),
                    self.topk,
                    f"exceeds the experts reachable in the selected groups "
                    f"(group_topk * experts_per_group = {reachable})",
                )
        elif self.topk > ffn.num_experts:
            _fail(self.key("topk"), self.topk, f"exceeds num_experts={ffn.num_experts}")


@dataclass(frozen=True)
class ModelConfig(_Section):
    """The decoder-only LM: attention, norms, and the FFN/router sections."""

    vocab_size: int = knob(2048, "vocabulary size (taken from the dataset)", gt=0)
    d_model: int = knob(256, "model width D", gt=0)
    n_layers: int = knob(4, "decoder layers", gt=0)
    n_heads: int = knob(4, "attention heads", gt=0)
    max_seq_len: int = knob(256, "context length (taken from the dataset)", gt=0)
    attention: str = knob("mha", "attention kind", choices=ATTENTION_KINDS)
    mla_q_head_dim: int = knob(128, "MLA query head dim", gt=0)
    mla_rope_head_dim: int = knob(64, "MLA rotary head dim (even)", gt=0)
    mla_v_head_dim: int = knob(128, "MLA value head dim", gt=0)
    mla_kv_lora_rank: int = knob(512, "MLA key/value compression rank", gt=0)
    rope_base: float = knob(10000.0, "RoPE base", gt=0)
    norm_eps: float = knob(1e-6, "RMSNorm epsilon", gt=0)
    init_std: float = knob(0.008, "init std of the weights", gt=0)
    tie_embeddings: bool = knob(False, "share the input embedding and the LM head")
    ffn: FFNConfig = knob(doc="the FFN block", factory=FFNConfig)
    router: RouterConfig = knob(doc="the router", factory=RouterConfig)
    _path: str = field(default="", repr=False, compare=False)

    def check(self) -> None:
        if self.attention == "mha":
            if self.d_model % self.n_heads:
                _fail(self.key("n_heads"), self.n_heads, f"must divide d_model={self.d_model}")
            if (self.d_model // self.n_heads) % 2:
                _fail(self.key("n_heads"), self.n_heads, "head dim d_model/n_heads must be even for RoPE")
        elif self.mla_rope_head_dim % 2:
            _fail(self.key("mla_rope_head_dim"), self.mla_rope_head_dim, "must be even for RoPE")
        if self.ffn.dense_layers > self.n_layers:
            _fail(self.ffn.key("dense_layers"), self.ffn.dense_layers, f"exceeds n_layers={self.n_layers}")
        self.router.check_against(self.ffn)

    @property
    def moe_layers(self) -> int:
        return 0 if self.ffn.kind == "dense" else self.n_layers - self.ffn.dense_layers


def group_aux_active(step: int, total_steps: int, start_frac: float) -> bool:
    """Whether L_G is on at ``step`` (0-based): the release switches on when step > total // 2 (docs/method.md §6).

    With start_frac = 0.5 this is exactly ``step > total_steps // 2``; in general
    ``step > int(total_steps * start_frac)``; start_frac = 0 turns it on from step 1. (Beside :class:`LossConfig`,
    whose ``group_aux_start_frac`` it reads, so that what reads the training logs needs no torch.)
    """
    return step > int(total_steps * start_frac)


@dataclass(frozen=True)
class LossConfig(_Section):
    """Auxiliary-loss coefficients and switches (docs/method.md).

    ``expert_aux_coeff`` is alpha_E for MoHGE's Intra-Group loss and the Switch / HMoE / MoDSE balance
    loss of the baselines. ``group_cost_weights`` overrides the release's omega_g = (h_g - h_min +
    interval) / interval when given. ``group_aux_start_frac``: L_G is on once step > start_frac * steps.
    ``balance_stats``: the routing counts f of every balance loss are those of the micro-batch on its rank
    (``micro_batch``, the release) or of the whole global batch (``global_batch``: summed over micro-batches and
    ranks before the loss is formed, so the loss does not depend on how the batch is split; docs/method.md §5.5).
    """

    expert_aux_coeff: float = knob(5e-3, "alpha_E: expert balance loss coefficient", ge=0)
    expert_aux_mode: str = knob(
        "all_experts_sparse",
        "how the expert loss is computed: over all experts with the sparse final gates, or within each group "
        "(docs/method.md §5.2)",
        choices=EXPERT_AUX_MODES,
        aliases=EXPERT_AUX_MODE_ALIASES,
    )
    group_aux_coeff: float = knob(1e-5, "alpha_G: group (cost) loss coefficient", ge=0)
    group_aux_start_frac: float = knob(0.5, "L_G is on once step > start_frac * steps", ge=0, le=1)
    group_cost_interval: int = knob(1024, "width interval of the release's group cost weights", gt=0)
    group_cost_min: int | None = knob(None, "h_min of the group cost weights (null: the smallest width)")
    group_cost_weights: tuple[float, ...] | None = knob(None, "explicit cost weight per group (null: derived)", gt=0)
    hmoe_penalty_coeff: float = knob(1e-2, "HMoE's parameter penalty coefficient", ge=0)
    balance_stats: str = knob(
        "micro_batch", "routing counts of the balance losses: per micro-batch or global batch", choices=BALANCE_STATS
    )
    _path: str = field(default="", repr=False, compare=False)

    def check_against(self, ffn: FFNConfig) -> None:
        if self.group_cost_weights is not None and len(self.group_cost_weights) != ffn.num_groups:
            _fail(
                self.key("group_cost_weights"),
                self.group_cost_weights,
                f"needs one weight per group (G={ffn.num_groups})",
            )
        if self.balance_stats == "global_batch" and self.expert_aux_mode == "per_group":
            _fail(
                self.key("balance_stats"),
                self.balance_stats,
                "needs expert_aux_mode 'all_experts_sparse': the per-group loss is a ratio of probability sums, which "
                "the global-batch counts cannot split over micro-batches",
            )


def load_model_config(path: str | Path) -> ModelConfig:
    """A model preset (``configs/models/*.yaml``) or the ``model`` section of a run config."""
    data = load_yaml_or_json(path)
    if "model" in data:
        data = data["model"]
    return ModelConfig.from_dict(data, "model")


@dataclass(frozen=True)
class ParallelConfig(_Section):
    """The multi-process layout of ``mohge.train.distributed`` (checked against the world by ``check_layout`` there).

    ``dp_shard``: FSDP2 degree (-1: the whole world; a divisor of the world gives HSDP, replicated over the
    rest). ``ep``: expert-parallel degree, borrowed from ``dp_shard`` as torchtitan does (0: ``model.ffn.ep_size``).
    ``peak_tflops``: one device's peak, for the MFU column of the log (0: no MFU).
    ``timeout_s``: how long a collective waits for a peer that died or stalls before the run stops with exit 6
    (docs/errors.md); also the process group's timeout of a DDP run (no ``parallel`` section: the default).
    Rank 0's lone phases (preparing data without ``--data``, the final evaluation) must fit in it.
    """

    dp_shard: int = knob(-1, "FSDP2 degree (-1: the whole world; a divisor of it gives HSDP)", ge=-1)
    ep: int = knob(0, "expert-parallel degree, taken from dp_shard (0: model.ffn.ep_size)", ge=0)
    activation_checkpointing: str = knob("none", "recompute activations per block", choices=AC_MODES)
    peak_tflops: float = knob(0.0, "one device's peak TFLOP/s, for the MFU column (0: no MFU)", ge=0)
    timeout_s: float = knob(
        600.0, "seconds a collective waits for the other ranks; then every rank stops (exit 6)", gt=0
    )
    _path: str = field(default="", repr=False, compare=False)

    def check(self) -> None:
        if self.dp_shard == 0:
            _fail(self.key("dp_shard"), self.dp_shard, "must be -1 (the whole world) or >= 1")


@dataclass(frozen=True)
class TrainConfig(_Section):
    """Optimisation: AdamW, linear warmup then cosine decay to ``min_lr``, clipping, accumulation.

    ``batch_size`` is sequences per optimizer step *per process*; ``grad_accum`` splits it into micro-batches.
    ``precision: auto`` trains bf16 autocast on CUDA, and on a CPU bf16 only where it has bf16 units,
    ``model.d_model`` >= 256 and a bf16 GEMM measured at start runs clearly faster than fp32, else fp32
    (mohge.train.runtime.auto_precision; the measurement is recorded in the run's summary: mohge.kernels.cpu_gemm).
    """

    steps: int = knob(200, "optimizer steps", gt=0)
    batch_size: int = knob(16, "sequences per optimizer step per process", gt=0)
    grad_accum: int = knob(1, "micro-batches per step (divides batch_size)", gt=0)
    lr: float = knob(3e-3, "peak learning rate", gt=0)
    min_lr: float = knob(3e-4, "learning rate at the end of the cosine", ge=0)
    warmup_steps: int = knob(20, "linear warmup steps", ge=0)
    weight_decay: float = knob(0.1, "AdamW weight decay of the >= 2-D weights", ge=0)
    beta1: float = knob(0.9, "AdamW beta1", ge=0, lt=1)
    beta2: float = knob(0.95, "AdamW beta2", ge=0, lt=1)
    adamw: str = knob(
        "auto",
        "AdamW's implementation: foreach (torch's per-op loops over all tensors), fused (torch's one-pass kernel, on a "
        "CPU about 3x faster at 26 M parameters: docs/speed.md; its rounding is not foreach's, so a CPU run's numbers "
        "differ from a foreach run's in the last bits and grow apart as chaotic training does), auto (fused on CUDA "
        "and on the fused path, train.fused; foreach on a CPU otherwise: the committed CPU runs' arithmetic)",
        choices=ADAMW_IMPLS,
    )
    fused: bool = knob(
        False,
        "the fused path for small models (mohge.model.fused): attention halves over causal windows and "
        "the MoE routers compiled by torch.compile, the CPU expert block with a transposed SiLU and its "
        "combine compiled, the LM head's loss in chunks; about 2x the tokens/s at d_model 32 and 64 (docs/speed.md), "
        "in other roundings than eager, so such a run's numbers differ from an eager run's; one process or DDP only",
    )
    grad_clip: float = knob(1.0, "gradient norm clip (0: none)", ge=0)
    seed: int = knob(0, "seed of init and batches", ge=0)
    data_order: str = knob(
        "random",
        "train batches: random windows (a pure function of seed, step, rank) or sequential (every window of the "
        "split once per epoch, shards in a seeded order per epoch, ranks disjoint; the position is checkpointed)",
        choices=DATA_ORDERS,
    )
    ckpt_every: int = knob(50, "steps between checkpoints", gt=0)
    keep_checkpoints: int = knob(2, "checkpoints kept in scratch", gt=0)
    log_every: int = knob(10, "steps per train_log row", gt=0)
    eval_every: int = knob(0, "steps between validation losses (0: none)", ge=0)
    eval_batches: int = knob(8, "batches of a validation loss", ge=0)
    device: str = knob("auto", "training device", choices=DEVICES)
    precision: str = knob(
        "auto",
        "fp32, or bf16 autocast (auto: bf16 on CUDA, and on a CPU with bf16 units when model.d_model >= 256)",
        choices=PRECISIONS,
    )
    threads: int = knob(0, "torch CPU threads (0: torch's default)", ge=0)
    parallel: ParallelConfig | None = knob(None, "multi-process layout (None: one process, or DDP under torchrun)")
    _path: str = field(default="", repr=False, compare=False)

    def check(self) -> None:
        if self.min_lr > self.lr:
            _fail(self.key("min_lr"), self.min_lr, f"exceeds lr={self.lr}")
        if self.warmup_steps >= self.steps:
            _fail(self.key("warmup_steps"), self.warmup_steps, f"must be < steps={self.steps}")
        if self.batch_size % self.grad_accum:
            _fail(self.key("grad_accum"), self.grad_accum, f"must divide batch_size={self.batch_size}")


@dataclass(frozen=True)
class EvalConfig(_Section):
    """Evaluation through lm-eval and routing traces on held-out data.

    ``tasks``: names of the task YAMLs shipped in ``mohge/tasks`` (offline) and, when the hub is reachable,
    lm-eval's standard tasks. ``limit``: at most this many documents per task (0 = all). ``heldout_batches``: the
    val/test loss and the routing trace over the first this many batches of ``batch_size`` sequences of each split
    (0 = the whole split).
    ``allow_hub``: let the standard tasks download their data (the workflow passes ``--allow-hub``); off for offline
    machines.
    """

    tasks: tuple[str, ...] = knob(("mohge_ppl",), "lm-eval tasks (mohge/tasks, or standard ones with allow_hub)")
    batch_size: int = knob(16, "evaluation batch size", gt=0)
    limit: int = knob(0, "documents per task at most (0: all)", ge=0)
    heldout_batches: int = knob(
        0, "val/test loss and routing trace over the first this many batches of each split (0: all)", ge=0
    )
    trace_batches: int = knob(16, "batches of routing traces", ge=0)
    allow_hub: bool = knob(False, "let lm-eval's standard tasks download their data")
    _path: str = field(default="", repr=False, compare=False)


@dataclass(frozen=True)
class RunConfig(_Section):
    """One run, resolved: what ``results/<run>/config.json`` holds and ``python -m mohge.train`` reads."""

    name: str = knob("run", "run name, {dataset}-{family}[-{variant}]-s{seed}")
    family: str = knob("mohge", "model family (mohge.config.matched.FAMILIES)")
    variant: str = knob("", "variant name ('' for none)")
    dataset: str = knob("data", "dataset name")
    model: ModelConfig = knob(doc="the model", factory=ModelConfig)
    loss: LossConfig = knob(doc="the losses", factory=LossConfig)
    train: TrainConfig = knob(doc="the optimisation", factory=TrainConfig)
    data: dict = knob(doc="the data section (DataConfig)", factory=dict)
    eval: EvalConfig = knob(doc="the evaluation", factory=EvalConfig)
    _path: str = field(default="", repr=False, compare=False)

    def check(self) -> None:
        for key in ("name", "family", "dataset"):
            check_name(getattr(self, key), self.key(key), part=key == "dataset")
        if self.variant:
            check_name(self.variant, self.key("variant"), part=True)
        self.loss.check_against(self.model.ffn)
        data = self.data_config  # parsed here so a bad key fails before anything runs
        if data.vocab_size > self.model.vocab_size:
            _fail(self.key("data.vocab_size"), data.vocab_size, f"exceeds model.vocab_size={self.model.vocab_size}")
        if data.seq_len > self.model.max_seq_len:
            _fail(self.key("data.seq_len"), data.seq_len, f"exceeds model.max_seq_len={self.model.max_seq_len}")

    @property
    def data_config(self) -> DataConfig:
        return _coerce(DataConfig, self.data, self.key("data"))


def load_run_config(path: str | Path) -> RunConfig:
    """The resolved run config (JSON written by the workflow, or YAML written by hand)."""
    return RunConfig.from_dict(load_yaml_or_json(path))
