"""The pieces of one training step, for the training loop (:mod:`mohge.train.trainer`) on every layout: the
learning-rate schedule, the optimizer, the loss with its auxiliary terms, the finite check and optimizer step, the
window meter of the log and the reading of an existing log on resume.
The formulas are in mohge.train's docstring (docs/method.md §5.4, §6).

Legend: B batch, S sequence length, L MoE layers.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.optim.adam as _adam_module

from mohge.config import FFNConfig, RunConfig, TrainConfig
from mohge.config.sections import group_aux_active
from mohge.model.allocation import place
from mohge.model.losses import weighted_aux
from mohge.model.moe import LayerStats, MoELayer, routing_summary

from .runtime import Runtime

log = logging.getLogger("mohge.train")


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm of a step is NaN or infinite."""


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate of 0-based step ``step``: linear warmup to ``lr``, then cosine to ``min_lr``."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    progress = min(1.0, (step - tc.warmup_steps) / max(1, tc.steps - 1 - tc.warmup_steps))
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1.0 + math.cos(math.pi * progress))


def _raw(fn: Any) -> Any:
    """The function under torch's decorators (``functools.wraps`` keeps it as ``__wrapped__``)."""
    return inspect.unwrap(fn)


# the functions of torch.optim that torch wraps in ``torch._disable_dynamo`` (it imports torch._dynamo on a first call)
_MARKED = (
    torch.optim.Optimizer.add_param_group,
    torch.optim.Optimizer.zero_grad,
    torch.optim.Optimizer.state_dict,
    torch.optim.Optimizer.load_state_dict,
    _adam_module.adam,
)
_ADAM_STEP = _raw(torch.optim.Adam.step)  # Adam.step's body, under _use_grad_for_differentiable


def _mark_compiler_free() -> bool:
    """Give each function of :data:`_MARKED` the disabled form that ``torch._disable_dynamo`` would import the compiler
    to build, itself: in a process where nothing is compiled the disabled form of a function is the function. Done
    only while ``torch._dynamo`` is not imported; returns whether the marks are set. A process that compiles after
    them would trace these functions where torch skips them: mohge compiles models (``mohge bench compile``), never an
    optimizer step. On a torch whose functions here are not wrappers, the marks stop at the first such function (a
    mark or none, each function computes the same)."""
    if "torch._dynamo" in sys.modules:
        return False
    for fn in _MARKED:
        raw = _raw(fn)
        if raw is fn:  # not a wrapper here: another torch, whose internals this does not know
            return False
        raw.__dynamo_disable = raw
    return True


class AdamW(torch.optim.AdamW):
    """torch's AdamW, every update its own, without importing torch's compiler front end in a process that compiles
    nothing.

    torch wraps an optimizer's ``step``, ``zero_grad``, ``add_param_group`` and ``state_dict`` and the functional Adam
    update so that torch.compile does not trace them, and builds that wrapper by importing ``torch._dynamo`` on a first
    call: about 1 s of a process's start-up, a third of a training job of the smoke study. Here ``step`` runs Adam's
    step body under the grad mode torch's step wrapper sets (``differentiable``: False, no grad), and the other
    functions find their disabled form already set (:func:`_mark_compiler_free`), so a training process whose model is
    not compiled never imports the compiler (tests/unit/test_train.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _mark_compiler_free()
        super().__init__(*args, **kwargs)

    def step(self, closure: Any = None) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _ADAM_STEP(self, closure)


def fused_adamw(tc: TrainConfig, device: torch.device) -> bool:
    """Whether ``train.adamw`` asks for torch's fused AdamW on ``device`` (``auto``: on CUDA, and on the fused path,
    ``train.fused``, whose runs have arithmetic of their own)."""
    return tc.adamw == "fused" or (tc.adamw == "auto" and (device.type == "cuda" or tc.fused))


def use_fused_path(model: torch.nn.Module, tc: TrainConfig) -> int:
    """``train.fused``: when true, ``model`` trains on the fused path from now on (:mod:`mohge.model.fused`); returns
    how many modules were switched (0 when false)."""
    if not tc.fused:
        return 0
    from mohge.model.fused import use_fused

    return use_fused(model)


def build_optimizer(model: torch.nn.Module, tc: TrainConfig, fused: bool = False) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters: ``fused`` (:func:`fused_adamw`), else the foreach implementation where
    every parameter is a plain tensor (it updates each tensor with the single-tensor loop's arithmetic, bit for bit,
    in fewer calls; torch picks foreach by itself on CUDA only), else torch's default (sharded parameters)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or name.startswith("embed.") else decay).append(p)
    groups = [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    plain = all(type(p.data) is torch.Tensor for p in model.parameters())
    foreach = True if not fused and plain else None
    return AdamW(groups, lr=lr_at(0, tc), betas=(tc.beta1, tc.beta2), eps=1e-8, fused=fused or None, foreach=foreach)


def compute_loss(
    model: torch.nn.Module, x_BS: torch.Tensor, y_BS: torch.Tensor, cfg: RunConfig, step: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[LayerStats]]:
    """(total, lm, weighted aux, per-layer stats) of one micro-batch at 0-based ``step``."""
    out = model(x_BS, y_BS)
    lm = F.cross_entropy(out.logits.float().flatten(0, 1), y_BS.flatten()) if out.lm_loss is None else out.lm_loss
    aux = lm.new_zeros(())
    for stats in out.layers:
        aux = aux + weighted_aux(stats.aux, cfg.loss, step, cfg.train.steps)
    return lm + aux, lm, aux, out.layers


def set_global_balance(
    model: torch.nn.Module, micro_x: list[torch.Tensor], rt: Runtime, autocast: torch.dtype | None
) -> None:
    """Global-batch statistics of the balance losses (``loss.balance_stats: global_batch``, docs/method.md §5.5).

    A forward pass without gradient over this rank's micro-batches counts the routing of the whole step (the
    parameters do not change within a step, so these are the counts the gradient passes route by); the counts are
    summed over micro-batches and ranks and set on every MoE layer as a mean per micro-batch and rank. Each
    micro-batch's loss c / T^2 * sum_e P_e f_e then reads the global f, and the mean over micro-batches and ranks
    of its gradient is that of the global-batch loss c / (M W T)^2 * sum_e P^all_e f^all_e exactly, for any
    split of the batch into M micro-batches on W ranks. Costs one forward pass per step (none when M W = 1).
    """
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    for layer in layers:
        layer.balance_counts = None
    splits = len(micro_x) * rt.world
    if not layers or splits == 1:
        return
    total = None
    with torch.no_grad(), torch.autocast(rt.device.type, dtype=autocast, enabled=autocast is not None):
        for x_BS in micro_x:
            counts = [st.balance_counts() for st in model(x_BS).layers]
            total = counts if total is None else [a + b for a, b in zip(total, counts, strict=True)]
    flat = torch.cat(total)
    if rt.world > 1:
        dist.all_reduce(flat)
    mean = (flat / splits).float()
    for layer, f in zip(layers, mean.split([len(c) for c in total]), strict=True):
        layer.balance_counts = f


def bias_balanced(model: torch.nn.Module) -> list[MoELayer]:
    """The MoE layers whose router balances with a selection bias (docs/method.md §5.6 experts, §5.7 groups)."""
    return [m for m in model.modules() if isinstance(m, MoELayer) and getattr(m.router, "selection_biased", False)]


def update_selection_bias(layers: list[MoELayer], step_counts: list[torch.Tensor], rt: Runtime) -> None:
    """After the optimizer step: each bias-balanced layer's biases from the step's routed tokens per expert, summed
    over micro-batches (``step_counts``, one [E] per layer of ``layers``) and ranks, so every rank updates alike."""
    counts = torch.stack(step_counts)
    if rt.world > 1:
        dist.all_reduce(counts)
    for layer, counts_E in zip(layers, counts, strict=True):
        layer.router.update_selection_bias(counts_E)


# ----------------------------------------------------------------------------------------------------
# Log rows
# ----------------------------------------------------------------------------------------------------


class WindowMeter:
    """Sums over one log window; routing sums stay on the device until a row is written. ``expert_flops`` sums the
    training FLOPs of this rank's routed experts where the layout measures them (the sharded one does)."""

    def __init__(self) -> None:
        self.steps, self.micro, self.tokens, self.time = 0, 0, 0, 0.0
        self.sums = dict.fromkeys(("loss", "lm_loss", "aux_loss", "grad_norm"), 0.0)
        self.counts_LE: torch.Tensor | None = None
        self.aux_L: dict[str, torch.Tensor] = {}
        self.expert_flops = torch.zeros((), dtype=torch.float64)

    def add_micro(self, layers: list[LayerStats]) -> None:
        self.micro += 1
        if not layers:
            return
        counts = torch.stack([st.counts_E for st in layers])
        self.counts_LE = counts if self.counts_LE is None else self.counts_LE + counts
        for name in layers[0].aux:
            v = torch.stack([st.aux[name].detach().float() for st in layers])
            self.aux_L[name] = v if name not in self.aux_L else self.aux_L[name] + v

    def state(self) -> dict[str, Any]:
        """The accumulators, for the checkpoint: a resumed run's first row covers its whole window."""
        counts = None if self.counts_LE is None else self.counts_LE.cpu()
        plain = {"steps": self.steps, "micro": self.micro, "tokens": self.tokens, "time": self.time}
        return {
            **plain,
            "sums": dict(self.sums),
            "counts_LE": counts,
            "aux_L": {k: v.cpu() for k, v in self.aux_L.items()},
            "expert_flops": self.expert_flops.clone(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any] | None, device: torch.device) -> WindowMeter:
        meter = cls()
        if state:
            meter.steps, meter.micro, meter.tokens, meter.time = (
                state[k] for k in ("steps", "micro", "tokens", "time")
            )
            meter.sums = dict(state["sums"])
            meter.counts_LE = None if state["counts_LE"] is None else state["counts_LE"].to(device)
            meter.aux_L = {k: v.to(device) for k, v in state["aux_L"].items()}
            meter.expert_flops = state.get("expert_flops", meter.expert_flops).clone()
        return meter

    def add_step(self, values: dict[str, float], tokens: int, seconds: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.time += seconds
        for k in self.sums:
            self.sums[k] += values[k]

    def row(self, step: int, lr: float, cfg: RunConfig, rt: Runtime, total_tokens: int) -> dict[str, Any]:
        row: dict[str, Any] = {"step": step, "lr": lr}
        row.update({k: v / max(self.steps, 1) for k, v in self.sums.items()})
        row["tokens"] = total_tokens
        row["tokens_per_s"] = self.tokens / self.time if self.time > 0 else None
        row["group_aux_active"] = group_aux_active(step, cfg.train.steps, cfg.loss.group_aux_start_frac)
        if self.counts_LE is None:
            return row
        counts, aux = self.counts_LE.clone(), {k: v.clone() for k, v in self.aux_L.items()}
        if rt.world > 1:
            dist.all_reduce(counts)
            for v in aux.values():
                dist.all_reduce(v)
        means = {k: (v / (self.micro * rt.world)).tolist() for k, v in aux.items()}
        row["aux"] = {k: sum(v) for k, v in means.items()}
        row["aux_layers"] = means
        ffn = cfg.model.ffn
        ep, placed = planned_placement(ffn, counts.sum(0).tolist())
        row.update(routing_summary(counts, ffn.per_expert_widths, ffn.num_groups, cfg.model.router.topk, placed))
        if placed is not None:
            row["rank_flops_ep"] = ep
        return row


def planned_placement(ffn: FFNConfig, load_E: list[float]) -> tuple[int, list[int] | None]:
    """(EP size, rank of each expert) the log's per-rank load is computed at: the config's placement at its own
    ``ep_size`` when that plans for several ranks, else at the largest of 4, 2 (4: where the all-size allocation is
    defined, docs/method.md) the placement allows; ``load_E`` feeds a placement that balances measured loads."""
    for ep in (ffn.ep_size,) if ffn.ep_size > 1 else (4, 2):
        try:
            return ep, place(ffn.placement, ffn.per_expert_widths, ep, load_E, ffn.experts_per_group)
        except ValueError:
            continue
    return 1, None


def progress(row: dict[str, Any]) -> dict[str, str]:
    """The progress line's figures from a log row: loss, tokens/s and, where the model routes, the worst MoE layer's
    expert load (max/mean of routed slots), unused experts and per-rank FLOP max/mean."""
    out = {"loss": f"{row['loss']:.4f}", "tok_s": f"{row['tokens_per_s'] or 0:.0f}"}
    if "expert_load" in row:
        out["load"] = f"{max(row['expert_load']):.2f}"
        out["unused"] = str(max(row["unused_experts"]))
    if "rank_flops" in row:
        out[f"rank_ep{row['rank_flops_ep']}"] = f"{max(row['rank_flops']):.2f}"
    return out


def optimizer_step(
    s: int, sums: torch.Tensor, gnorm: torch.Tensor, opt: torch.optim.Optimizer, rt: Runtime, last_good: Path | None
) -> dict[str, float]:
    """Step ``s``'s logged values (loss, lm_loss, aux_loss from the reduced ``sums``; the clipped ``gnorm``), then the
    optimizer step; a non-finite value stops the run before the step, naming the last good checkpoint."""
    loss, lm_loss, aux_loss, grad_norm = torch.cat([sums, gnorm.reshape(1).float()]).tolist()
    if not all(map(math.isfinite, (loss, lm_loss, aux_loss, grad_norm))):
        raise NonFiniteLossError(
            f"non-finite loss at step {s} (loss={loss}, lm_loss={lm_loss}, aux={aux_loss}, "
            f"grad_norm={grad_norm}); stopped before the optimizer step; last good checkpoint: {last_good or 'none'}"
        )
    opt.step()
    opt.zero_grad(set_to_none=True)
    if rt.device.type == "cuda":
        torch.cuda.synchronize()
    return {"loss": loss, "lm_loss": lm_loss, "aux_loss": aux_loss, "grad_norm": grad_norm}


def read_log(path: Path, before_step: int) -> list[dict[str, Any]]:
    """Rows of an existing log with step < ``before_step`` (rows of steps lost to a kill are dropped, and so
    is a line cut short by one)."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s: dropping an incomplete line", path)
                continue
            if row.get("step", before_step) < before_step:
                rows.append(row)
    return rows
