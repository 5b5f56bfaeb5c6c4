"""Typed, strictly loaded configuration: one dataclass per component, one resolved file per run.

Every section is a frozen dataclass with a ``from_dict`` that refuses unknown keys and checks values in
``__post_init__``, so a bad config fails before anything is built, with a message that names the key
(as a dotted path such as ``model.ffn.group_topk``) and the value. Each constructor receives only its own
section (``MoHGELayer`` gets ``FFNConfig`` and ``RouterConfig``, the trainer gets ``TrainConfig``, ...).

The MoHGE-specific fields follow the official release (spec ``shared/spec/mohge.md`` section 7); the
section 6 ambiguities are switches: ``RouterConfig.gate_mode``, ``LossConfig.group_cost_interval`` /
``group_cost_weights``, ``LossConfig.group_aux_start_frac`` and ``LossConfig.expert_aux_mode``.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FFN_KINDS = ("dense", "moe", "mohge", "hmoe", "modse")
GATE_MODES = ("code_exact", "product_renorm")
SCORE_FUNCTIONS = ("sigmoid", "softmax")
PLACEMENTS = ("contiguous", "all_size", "modse_pairs", "flop_lpt")
ATTENTION_KINDS = ("mha", "mla")
BACKENDS = ("auto", "triton", "torch", "loop")
EXPERT_AUX_MODES = ("code", "per_group")


class ConfigError(ValueError):
    """A user mistake in a config: the message names the key and the offending value."""


def _fail(path: str, value: Any, why: str) -> typing.NoReturn:
    raise ConfigError(f"{path}={value!r}: {why}")


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """Convert a plain YAML/JSON value to the annotated field type (tuples, nested sections, optionals)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, path)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            _fail(path, value, f"expected a mapping for section {tp.__name__}")
        if issubclass(tp, _Section) or not hasattr(tp, "from_dict"):
            return from_dict(tp, value, path)
        try:  # a component that owns its loader (mohge.data.DataConfig)
            return tp.from_dict(value)
        except ValueError as err:
            raise ConfigError(f"{path}: {err}") from err
    if origin is tuple:
        if not isinstance(value, list | tuple):
            _fail(path, value, "expected a list")
        (item_tp, *_rest) = typing.get_args(tp)
        return tuple(_coerce(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            _fail(path, value, "expected a mapping")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            _fail(path, value, "expected a number")
        try:
            return float(value)
        except ValueError:
            _fail(path, value, "expected a number")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, value, "expected an integer")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, value, "expected true or false")
        return value
    if tp is str:
        if not isinstance(value, str):
            _fail(path, value, "expected a string")
        return value
    return value


def from_dict(cls: type, data: dict, path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; an unknown key is an error naming it and the known keys."""
    if not isinstance(data, dict):
        _fail(path or cls.__name__, data, f"expected a mapping for {cls.__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    public = sorted(names - {"_path"})
    unknown = sorted(set(data) - set(public))
    if unknown:
        key = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{key}: unknown key (known keys of {cls.__name__}: {', '.join(public)})")
    kwargs = {k: _coerce(hints[k], v, f"{path}.{k}" if path else k) for k, v in data.items()}
    try:
        return cls(**kwargs, _path=path) if "_path" in names else cls(**kwargs)
    except TypeError as err:  # a required field without default
        raise ConfigError(f"{path or cls.__name__}: {err}") from err


def to_dict(obj: Any) -> Any:
    """Plain JSON-able view of a config (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "_path"}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


class _Section:
    """Mixin: ``from_dict`` classmethod and a ``key()`` helper that prefixes the section path."""

    _path: str

    @classmethod
    def from_dict(cls, data: dict, path: str = ""):
        return from_dict(cls, data, path)

    def key(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name


def _positive(section: _Section, name: str, value: float) -> None:
    if value <= 0:
        _fail(section.key(name), value, "must be > 0")


@dataclass(frozen=True)
class FFNConfig(_Section):
    """The feed-forward block of every MoE layer: which family, how many experts, which widths.

    Experts come in ``len(expert_widths)`` width classes of ``num_experts / len(expert_widths)`` experts
    each, in class-major order. For ``mohge`` the classes are the router's groups (spec section 1.1);
    ``moe`` has one class; ``hmoe`` and ``modse`` have several classes under a flat router.
    """

    kind: str = "mohge"
    num_experts: int = 64
    expert_widths: tuple[int, ...] = (384, 512, 640, 768, 896, 1024, 1152, 1280)
    shared_expert_width: int = 2048
    dense_layers: int = 1
    dense_width: int = 6144
    placement: str = "all_size"
    ep_size: int = 1
    backend: str = "auto"
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

    def __post_init__(self) -> None:
        if self.kind not in FFN_KINDS:
            _fail(self.key("kind"), self.kind, f"must be one of {FFN_KINDS}")
        if self.backend not in BACKENDS:
            _fail(self.key("backend"), self.backend, f"must be one of {BACKENDS}")
        if self.placement not in PLACEMENTS:
            _fail(self.key("placement"), self.placement, f"must be one of {PLACEMENTS}")
        for name in ("dense_layers", "shared_expert_width"):
            if getattr(self, name) < 0:
                _fail(self.key(name), getattr(self, name), "must be >= 0")
        _positive(self, "dense_width", self.dense_width)
        _positive(self, "ep_size", self.ep_size)
        if self.kind == "dense":
            return
        _positive(self, "num_experts", self.num_experts)
        if not self.expert_widths:
            _fail(self.key("expert_widths"), self.expert_widths, "needs at least one width")
        for i, w in enumerate(self.expert_widths):
            if w <= 0:
                _fail(self.key(f"expert_widths[{i}]"), w, "every expert width must be > 0")
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
        """All-size allocation and MoDSE pairs need even G and widths symmetric around their mean (spec 4.3)."""
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
    """Routing: MoHGE's two-level router (spec section 2) and the flat top-k router of the baselines."""

    topk: int = 6
    group_topk: int = 4
    group_score: str = "sigmoid"
    gate_mode: str = "code_exact"
    init_std: float = 0.008
    _path: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        _positive(self, "topk", self.topk)
        _positive(self, "group_topk", self.group_topk)
        _positive(self, "init_std", self.init_std)
        if self.group_score not in SCORE_FUNCTIONS:
            _fail(self.key("group_score"), self.group_score, f"must be one of {SCORE_FUNCTIONS}")
        if self.gate_mode not in GATE_MODES:
            _fail(self.key("gate_mode"), self.gate_mode, f"must be one of {GATE_MODES}")

    def check_against(self, ffn: FFNConfig) -> None:
        """Cross-checks that need the FFN section (called by ModelConfig)."""
        if ffn.kind == "dense":
            return
        if ffn.kind == "mohge":
            if self.group_topk > ffn.num_groups:
                _fail(
                    self.key("group_topk"),
                    self.group_topk,
                    f"exceeds the number of groups G={ffn.num_groups}",
                )
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

    vocab_size: int = 2048
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    max_seq_len: int = 256
    attention: str = "mha"
    mla_q_head_dim: int = 128
    mla_rope_head_dim: int = 64
    mla_v_head_dim: int = 128
    mla_kv_lora_rank: int = 512
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.008
    tie_embeddings: bool = False
    ffn: FFNConfig = field(default_factory=FFNConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    _path: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len", "init_std"):
            _positive(self, name, getattr(self, name))
        if self.attention not in ATTENTION_KINDS:
            _fail(self.key("attention"), self.attention, f"must be one of {ATTENTION_KINDS}")
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


@dataclass(frozen=True)
class LossConfig(_Section):
    """Auxiliary-loss coefficients and switches (spec section 3 and section 6 readings 2-4).

    ``expert_aux_coeff`` is alpha_E for MoHGE's Intra-Group loss and the Switch / HMoE / MoDSE balance
    loss of the baselines. ``group_cost_weights`` overrides the release's omega_g = (h_g - h_min +
    interval) / interval when given. ``group_aux_start_frac``: L_G is on once step > start_frac * steps.
    """

    expert_aux_coeff: float = 5e-3
    expert_aux_mode: str = "code"
    group_aux_coeff: float = 1e-5
    group_aux_start_frac: float = 0.5
    group_cost_interval: int = 1024
    group_cost_min: int | None = None
    group_cost_weights: tuple[float, ...] | None = None
    hmoe_penalty_coeff: float = 1e-2
    _path: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("expert_aux_coeff", "group_aux_coeff", "hmoe_penalty_coeff"):
            if getattr(self, name) < 0:
                _fail(self.key(name), getattr(self, name), "must be >= 0")
        if not 0.0 <= self.group_aux_start_frac <= 1.0:
            _fail(self.key("group_aux_start_frac"), self.group_aux_start_frac, "must lie in [0, 1]")
        _positive(self, "group_cost_interval", self.group_cost_interval)
        if self.expert_aux_mode not in EXPERT_AUX_MODES:
            _fail(self.key("expert_aux_mode"), self.expert_aux_mode, f"must be one of {EXPERT_AUX_MODES}")
        if self.group_cost_weights is not None and any(w <= 0 for w in self.group_cost_weights):
            _fail(self.key("group_cost_weights"), self.group_cost_weights, "every weight must be > 0")

    def check_against(self, ffn: FFNConfig) -> None:
        if self.group_cost_weights is not None and len(self.group_cost_weights) != ffn.num_groups:
            _fail(
                self.key("group_cost_weights"),
                self.group_cost_weights,
                f"needs one weight per group (G={ffn.num_groups})",
            )


def load_yaml_or_json(path: str | Path) -> dict:
    """Read a YAML or JSON mapping; a missing or malformed file is an error that names it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"config file {str(p)!r} is not valid {p.suffix.lstrip('.') or 'YAML'}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping, got {type(data).__name__}")
    return data


def load_model_config(path: str | Path) -> ModelConfig:
    """A model preset (``configs/models/*.yaml``) or the ``model`` section of a run config."""
    data = load_yaml_or_json(path)
    if "model" in data:
        data = data["model"]
    return ModelConfig.from_dict(data, "model")


PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
AC_MODES = ("none", "block")


@dataclass(frozen=True)
class ParallelConfig(_Section):
    """The multi-process layout of ``mohge.distributed`` (checked against the world by ``check_layout`` there).

    ``dp_shard``: FSDP2 degree (-1: the whole world; a divisor of the world gives HSDP, replicated over the
    rest). ``ep``: expert-parallel degree, borrowed from ``dp_shard`` as torchtitan does (0: ``model.ffn.ep_size``).
    ``peak_tflops``: one device's peak, for the MFU column of the log (0: no MFU).
    """

    dp_shard: int = -1
    ep: int = 0
    activation_checkpointing: str = "none"
    compile: bool = False
    peak_tflops: float = 0.0
    _path: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dp_shard == 0 or self.dp_shard < -1:
            _fail(self.key("dp_shard"), self.dp_shard, "must be -1 (the whole world) or >= 1")
        if self.ep < 0:
            _fail(self.key("ep"), self.ep, "must be >= 0 (0: model.ffn.ep_size)")
        if self.activation_checkpointing not in AC_MODES:
            _fail(self.key("activation_checkpointing"), self.activation_checkpointing, f"must be one of {AC_MODES}")
        if self.peak_tflops < 0:
            _fail(self.key("peak_tflops"), self.peak_tflops, "must be >= 0")


@dataclass(frozen=True)
class TrainConfig(_Section):
    """Optimisation: AdamW, linear warmup then cosine decay to ``min_lr``, clipping, accumulation.

    ``batch_size`` is sequences per optimizer step *per process*; ``grad_accum`` splits it into micro-batches.
    ``precision: auto`` trains fp32 on a CPU (bf16 is ~20x slower there) and bf16 autocast on CUDA.
    """

    steps: int = 200
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    ckpt_every: int = 50
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every: int = 0
    eval_batches: int = 8
    device: str = "auto"
    precision: str = "auto"
    threads: int = 0
    parallel: ParallelConfig | None = None  # None: one process, or DDP under torchrun
    _path: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "lr", "ckpt_every", "log_every", "keep_checkpoints"):
            _positive(self, name, getattr(self, name))
        for name in ("min_lr", "warmup_steps", "weight_decay", "grad_clip", "seed", "eval_every", "threads"):
            if getattr(self, name) < 0:
                _fail(self.key(name), getattr(self, name), "must be >= 0")
        if self.min_lr > self.lr:
            _fail(self.key("min_lr"), self.min_lr, f"exceeds lr={self.lr}")
        if self.warmup_steps >= self.steps:
            _fail(self.key("warmup_steps"), self.warmup_steps, f"must be < steps={self.steps}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                _fail(self.key(name), getattr(self, name), "must lie in [0, 1)")
        if self.batch_size % self.grad_accum:
            _fail(self.key("grad_accum"), self.grad_accum, f"must divide batch_size={self.batch_size}")
        if self.device not in DEVICES:
            _fail(self.key("device"), self.device, f"must be one of {DEVICES}")
        if self.precision not in PRECISIONS:
            _fail(self.key("precision"), self.precision, f"must be one of {PRECISIONS}")


@dataclass(frozen=True)
class EvalConfig(_Section):
    """Evaluation through lm-eval and routing traces on held-out data.

    ``tasks``: names of the task YAMLs shipped in ``configs/tasks`` (offline) and, when the hub is reachable,
    lm-eval's standard tasks. ``limit``: at most this many documents per task (0 = all). ``allow_hub``: let the
    standard tasks download their data (the workflow passes ``--allow-hub``); off for offline machines.
    """

    tasks: tuple[str, ...] = ("mohge_ppl",)
    batch_size: int = 16
    limit: int = 0
    trace_batches: int = 16
    allow_hub: bool = False
    _path: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        _positive(self, "batch_size", self.batch_size)
        if self.limit < 0:
            _fail(self.key("limit"), self.limit, "must be >= 0")
        if self.trace_batches < 0:
            _fail(self.key("trace_batches"), self.trace_batches, "must be >= 0")


def _data_config_type():
    from .data import DataConfig

    return DataConfig


@dataclass(frozen=True)
class RunConfig(_Section):
    """One run, resolved: what ``results/<run>/config.json`` holds and ``python -m mohge.train`` reads."""

    name: str = "run"
    family: str = "mohge"
    variant: str = ""
    dataset: str = "data"
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: dict = field(default_factory=dict)
    eval: EvalConfig = field(default_factory=EvalConfig)
    _path: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        self.loss.check_against(self.model.ffn)
        # the data section belongs to mohge.data; parse it here so a bad key fails before anything runs
        data = _coerce(_data_config_type(), self.data, self.key("data"))
        if data.vocab_size > self.model.vocab_size:
            _fail(self.key("data.vocab_size"), data.vocab_size, f"exceeds model.vocab_size={self.model.vocab_size}")
        if data.seq_len > self.model.max_seq_len:
            _fail(self.key("data.seq_len"), data.seq_len, f"exceeds model.max_seq_len={self.model.max_seq_len}")

    @property
    def data_config(self):
        return _coerce(_data_config_type(), self.data, self.key("data"))


def load_run_config(path: str | Path) -> RunConfig:
    """The resolved run config (JSON written by the workflow, or YAML written by hand)."""
    return RunConfig.from_dict(load_yaml_or_json(path))
