"""Training: AdamW with linear warmup and cosine decay, clipping, accumulation, aux losses, resume; one loop for
every layout (one process, DDP, FSDP2 + expert parallelism).

    python -m mohge.train --config results/<run>/config.json --out results/<run>/model [--scratch DIR]
    torchrun --standalone --nproc_per_node=4 -m mohge.train --config ... --out ... --gpus 4

The objective is L = L_LM + sum_layers weighted_aux(layer), the aux coefficients and the group-loss schedule
(on once step > total_steps * group_aux_start_frac, steps counted from 0) from ``LossConfig`` (docs/method.md §5.4, §6).

* Optimizer: AdamW (eps 1e-8); weight decay on the >= 2-D weights (attention, experts, routers, LM head),
  none on the RMSNorm gains and the input embedding.
* Schedule (:func:`lr_at`, a pure function of the step, so the "scheduler state" is the step alone):
  lr * (s + 1) / warmup for s < warmup, then cosine from lr at s = warmup to min_lr at s = steps - 1.
* Batches (``train.data_order``, :class:`mohge.data.stream.TrainBatches`): ``random``: step s of rank r reads
  ``TokenStream.get_batch(s, batch_size, seq_len, seed * 1000 + r)``, a pure function of (seed, step, rank);
  ``sequential``: the next ``batch_size x world`` windows of the split in shard order, rank r the r-th
  ``batch_size`` of them, each window once per epoch; the global window position is checkpointed.
  ``grad_accum`` splits a batch into equal micro-batches.
* Precision (``train.precision``; ``auto``: bf16 autocast on CUDA, and on a CPU with bf16 units when
  d_model >= 256 and a bf16 GEMM is measured faster there, else fp32: :func:`mohge.train.runtime.auto_precision`):
  under bf16 autocast every matrix product, the experts' included, runs in bf16 forward and backward; weights and
  optimizer state stay fp32, and the loss, softmaxes and norms run in fp32. The CPU's bf16 support (detected,
  measured) is in the summary.
* Resume: the newest valid checkpoint in SCRATCH (see :mod:`mohge.train.checkpoint`) is loaded; on a CPU the run
  then ends bit-identical to an uninterrupted one (deterministic algorithms, all RNG states restored).
* A non-finite loss or gradient norm stops the run before the optimizer step, naming the step; no
  checkpoint is written after it, so the newest one in SCRATCH is the last good state.
* Before the first step: OUT and SCRATCH are writable and locked (one writer each, mohge.core.atomic.output_lock),
  neither holds committed files of another run, the run passes mohge.config.preflight, the token shards and
  tokenizer.json match meta.json's sha256 (:func:`mohge.train.run_files.check_data`: at every start and resume,
  re-hashing the files whose size, mtime or ctime changed) and their sizes (on every open), tokenizer.json round-trips.
* OUT is sealed last by manifest.json (sha256 of each file, and the sha256 of the data folder's meta.json and
  tokenizer.json it was trained on); exit codes are mohge.core.cli's (docs/errors.md).
* SIGTERM / SIGINT (mohge.train.runtime.GracefulStop): the current step finishes, every rank checkpoints that step,
  the locks are released and the command exits 128 + the signal's number with one line; the run resumes.
* Layouts (:mod:`mohge.train.parallelism`): the loop below is the same for all; the layout builds and wraps the model,
  syncs gradients under accumulation, clips, saves and resumes, computes the held-out loss and writes the final
  weights. Without ``train.parallel`` (or in one process): :class:`~mohge.train.parallelism.Replicated`, one process
  or DDP; with it under torchrun: :class:`mohge.train.distributed.trainer.Sharded`, FSDP2 + expert parallelism with
  sharded checkpoints. Every layout checkpoints the same state (log-window meters included), appends log rows
  durably, and trains with fused AdamW on CUDA (the default, foreach, implementation on a CPU).

Log rows (SCRATCH/train_log.jsonl while running, each appended whole and fsynced; copied to OUT at the end; on resume
cut back to the checkpoint's step, whose window sums travel in the checkpoint), one per ``log_every`` steps:
``step`` is the 0-based index of the last step of the window; losses are means over the window (all ranks);
``aux`` the raw aux losses (no coefficient) summed over layers, ``aux_layers`` per layer; per MoE layer
``group_usage`` = routed slots per width class / all slots, ``mean_expert_width`` = sum_e share_e * width_e
(the mean width of one routed slot) and ``activated_expert_width`` = topk * that (routed FFN width per token); the load
``expert_load`` = max / mean of the routed slots over experts (1: even), ``unused_experts`` (under 1 % of a uniform
share), and ``rank_flops`` = max / mean routed FLOPs per rank of the config's placement at ``rank_flops_ep`` ranks
(mohge.model.moe.routing_summary). The sharded layout adds its throughput columns
(:data:`mohge.train.distributed.trainer.LOG_COLUMNS`). The progress line shows the worst layer's three.

Legend: B batch, S sequence length, L MoE layers, E experts, G width classes (MoHGE groups), K top-k.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from mohge.config import ConfigError, ParallelConfig, RunConfig, load_run_config, preflight
from mohge.core.atomic import append_line, output_lock, write_json_atomic, write_text_atomic
from mohge.core.cli import EXIT_NONFINITE, EXIT_OK, EXIT_PEER, EXIT_USER, progress_stream, setup_logging, user_errors
from mohge.data import TokenStream
from mohge.data.stream import TrainBatches
from mohge.model.moe import MoELayer

from . import checkpoint as ckpt
from .parallelism import Parallelism, Replicated
from .run_files import FINAL_FILES, TrainResult, check_data, data_seal, finish, resolve_data
from .runtime import (
    GracefulStop,
    LaunchError,
    PeerLostError,
    Runtime,
    Stopped,
    peer_failure,
    set_deterministic,
    setup_runtime,
)
from .step import (
    NonFiniteLossError,
    WindowMeter,
    bias_balanced,
    build_optimizer,
    compute_loss,
    fused_adamw,
    lr_at,
    optimizer_step,
    progress,
    read_log,
    set_global_balance,
    update_selection_bias,
    use_fused_path,
)

log = logging.getLogger("mohge.train")

# ----------------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------------


def train(
    cfg: RunConfig,
    out: str | Path,
    scratch: str | Path | None = None,
    data: str | None = None,
    require_resume: bool = False,
    gpus: int | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` (resuming from SCRATCH when it holds a valid checkpoint); returns the summary."""
    out, scratch = Path(out), Path(scratch) if scratch else Path(out) / ".scratch"
    if scratch.resolve() == out.resolve():
        raise ConfigError(
            f"--scratch {scratch} is --out: the checkpoints need a folder of their own (default OUT/.scratch)"
        )
    for folder, what in ((out, "--out"), (scratch, "--scratch")):  # committed results: only their own run
        preflight.check_not_committed(folder, what, cfg)
    for folder, what in ((out, "--out"), (scratch, "--scratch")):
        preflight.check_writable(folder, what)
    preflight.check_run(cfg, inputs=False)  # preparing the data checks its inputs, when it has to
    rt = setup_runtime(cfg.train, gpus, cfg.model.d_model)
    deterministic = torch.are_deterministic_algorithms_enabled()
    peer_lost = False
    try:
        preflight.check_backend(cfg, on_cpu=rt.device.type == "cpu")
        if rt.device.type == "cpu":  # every CPU op we use has a deterministic kernel: bit-exact resume
            set_deterministic(True)
        with contextlib.ExitStack() as locks:
            stop = locks.enter_context(GracefulStop().installed())
            if rt.main:  # one writer per output: a second training on the same folders is refused
                for folder in (out, scratch):
                    locks.enter_context(output_lock(folder, log))
            try:
                return _train(cfg, out, scratch, data, require_resume, rt, stop)
            except RuntimeError as err:
                if rt.world == 1 or not peer_failure(err):
                    raise
                peer_lost = True
                timeout = (cfg.train.parallel or ParallelConfig()).timeout_s
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise PeerLostError(
                    f"rank {rt.rank} of {rt.world}: a collective failed, another rank died or stalled past "
                    f"train.parallel.timeout_s={timeout:g} ({first[:200]}); the newest checkpoint in {scratch} "
                    "resumes the run"
                ) from err
    finally:
        set_deterministic(deterministic)
        if dist.is_initialized() and not peer_lost:  # the teardown of a broken group waits on the lost peer
            dist.destroy_process_group()


def parallelism(cfg: RunConfig, rt: Runtime, scratch: Path) -> Parallelism:
    """The layout of this run: FSDP2 / expert parallelism (mohge.train.distributed) with a ``train.parallel``
    section on several ranks, else one process or DDP."""
    if rt.world > 1 and cfg.train.parallel is not None:
        if cfg.train.fused:
            raise ConfigError(
                f"{cfg.train.key('fused')}=true: the fused path runs on one process or DDP, not with a "
                "train.parallel section on several ranks (set train.fused: false)"
            )
        from .distributed.trainer import Sharded

        return Sharded(cfg, rt, scratch)
    return Replicated(cfg, rt, scratch)


def _train(
    cfg: RunConfig,
    out: Path,
    scratch: Path,
    data: str | None,
    require_resume: bool,
    rt: Runtime,
    stop: GracefulStop | None = None,
) -> dict[str, Any]:
    """The training loop, on the layout :func:`parallelism` chooses; returns the summary (rank 0's; {} elsewhere)."""
    wall0, tc, stop = time.perf_counter(), cfg.train, stop or GracefulStop()
    par = parallelism(cfg, rt, scratch)  # a parallel layout is checked before anything starts
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    data_dir = _checked_data(cfg, data, scratch, rt)
    S, micro_B = cfg.data_config.seq_len, tc.batch_size // tc.grad_accum
    stream = par.train_stream(TokenStream.open(data_dir, "train"))
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = par.build()
    if use_fused_path(model, tc):
        log.info("train.fused: the fused path's graphs compile at the first steps (seconds; cached for later runs)")
    opt = build_optimizer(model, tc, fused=fused_adamw(tc, rt.device))
    at = par.resume(opt, require_resume)
    if at.path is not None:
        log.info("resuming from %s (step %d of %d, data %s)", at.path, at.step, tc.steps, at.data)
    window0 = ckpt.start_window(at.data, tc.data_order, at.path)
    batches = TrainBatches(stream, tc.data_order, tc.batch_size, S, tc.seed, rt.rank, rt.world, at.step, window0)
    log_path = scratch / "train_log.jsonl"
    rows = _log_cut_to(log_path, at.step, rt)
    model.train()
    tokens_per_step, last_good = tc.batch_size * S * rt.world, at.path
    meter, trained_tokens, train_time = WindowMeter.from_state(at.meter, rt.device), 0, 0.0
    biased = bias_balanced(model)
    with _progress_bar(cfg, rt, at.step) as bar, stop.in_loop():
        for s in range(at.step, tc.steps):
            t0 = time.perf_counter()
            vals = _step(s, par, opt, batches.batch(s), meter, biased, last_good)
            dt = time.perf_counter() - t0
            train_time += dt
            trained_tokens += tokens_per_step
            meter.add_step(vals, tokens_per_step, dt)
            bar.update(1)
            if (s + 1) % tc.log_every == 0 or s + 1 == tc.steps:
                row = meter.row(s, lr_at(s, tc), cfg, rt, (s + 1) * tokens_per_step)
                row.update(par.log_columns(row, meter))
                if tc.data_order == "sequential":  # where the next step reads (epoch, shard, offset for humans)
                    row["data"] = batches.position(s + 1)
                meter = WindowMeter()
                if rt.main:
                    _log_row(log_path, rows, row)
                    bar.set_postfix(progress(row), refresh=False)
            if tc.eval_every and (s + 1) % tc.eval_every == 0:
                val = par.heldout(data_dir, micro_B)
                if rt.main:
                    _log_row(log_path, rows, {"step": s, "val_loss": val["loss"], "val_ppl": val["ppl"]})
            signum = stop.requested(rt)  # SIGTERM / SIGINT on any rank: every rank checkpoints this step
            if (s + 1) % tc.ckpt_every == 0 or s + 1 == tc.steps or signum:
                last_good = par.save(s + 1, opt, meter, batches.position(s + 1))
            if signum:
                raise Stopped(signum, s + 1, last_good)
    result = TrainResult(cfg, rt, data_dir, rows, at.step, trained_tokens, train_time, par.heldout(data_dir, micro_B))
    summary = _write_outputs(out, par, result, batches.position(tc.steps), wall0)
    rt.barrier()
    return summary


def _checked_data(cfg: RunConfig, data: str | None, scratch: Path, rt: Runtime) -> Path:
    """The run's prepared data folder (:func:`mohge.train.run_files.resolve_data`), checked by rank 0 before the first
    step: a broken tokenizer or a changed token file is named, not trained on."""
    scratch.mkdir(parents=True, exist_ok=True)
    data_dir = resolve_data(cfg, data, scratch, rt)
    if rt.main:
        check_data(cfg, data_dir, scratch)
    rt.barrier()
    return data_dir


def _log_cut_to(path: Path, step: int, rt: Runtime) -> list[dict[str, Any]]:
    """The live log's rows before ``step`` (the resume point); rank 0 rewrites the file to hold just those."""
    rows = read_log(path, step)
    if rt.main:
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    rt.barrier()
    return rows


def _step(
    s: int,
    par: Parallelism,
    opt: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor],
    meter: WindowMeter,
    biased: list[MoELayer],
    last_good: Path | None,
) -> dict[str, float]:
    """Step ``s`` on the batch ``(x_BS, y_BS)``: every micro-batch's forward and backward, the gradients reduced
    and clipped, the optimizer step, then the selection bias of the ``biased`` layers; returns the step's logged
    values (:func:`mohge.train.step.optimizer_step`)."""
    cfg, rt = par.cfg, par.rt
    tc, (x_BS, y_BS) = cfg.train, batch
    for group in opt.param_groups:
        group["lr"] = lr_at(s, tc)
    micro_B = tc.batch_size // tc.grad_accum
    xs, ys = ([t.to(rt.device) for t in b.split(micro_B)] for b in (x_BS, y_BS))
    if cfg.loss.balance_stats == "global_batch":
        set_global_balance(par.model, xs, rt, rt.autocast)
    sums, step_counts = torch.zeros(3, device=rt.device), 0
    for m, (xm, ym) in enumerate(zip(xs, ys, strict=True)):
        with par.micro_batch(m, tc.grad_accum):
            with torch.autocast(rt.device.type, dtype=rt.autocast, enabled=rt.autocast is not None):
                total, lm, aux, layers = compute_loss(par.net, xm, ym, cfg, s)
            (total / tc.grad_accum).backward()
        sums += torch.stack([total, lm, aux]).detach().float() / tc.grad_accum
        meter.add_micro(layers)
        par.measure(meter, layers)
        if biased:
            step_counts = step_counts + torch.stack([st.counts_E for st in layers])
    par.reduce_grads()
    if rt.world > 1:  # the logged losses: the mean over ranks
        dist.all_reduce(sums)
        sums /= rt.world
    gnorm = par.clip_grad_norm(tc.grad_clip)
    vals = optimizer_step(s, sums, gnorm, opt, rt, last_good)
    if biased:
        update_selection_bias(biased, list(step_counts), rt)
    return vals


def _progress_bar(cfg: RunConfig, rt: Runtime, start: int) -> tqdm:
    """Rank 0's progress: a line redrawn ten times a second on a terminal; in a log file (stderr not a terminal) a
    whole line at most every 30 s (:func:`mohge.core.cli.progress_stream`). The log rows' postfix waits for the
    next update."""
    every = 0.1 if sys.stderr.isatty() else 30
    return tqdm(
        total=cfg.train.steps,
        initial=start,
        disable=not rt.main,
        desc=cfg.name,
        unit="step",
        mininterval=every,
        file=progress_stream(),
    )


def _log_row(path: Path, rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """Keep ``row`` and append it to the live log whole and durably (one write, then fsync)."""
    rows.append(row)
    append_line(path, json.dumps(row))


def _write_outputs(
    out: Path, par: Parallelism, result: TrainResult, data_position: dict[str, Any], wall0: float
) -> dict[str, Any]:
    """OUT: the weights (every rank: the layout exports them), then on rank 0 the log, config.json, tokenizer.json,
    summary.json and, last, the manifest that seals the folder. Returns the summary (rank 0's; {} elsewhere)."""
    if par.rt.main:
        (out / ckpt.MANIFEST).unlink(missing_ok=True)  # a folder being rewritten is unsealed until the end
    par.export(out / "model.safetensors")
    if not par.rt.main:
        return {}
    write_text_atomic(out / "train_log.jsonl", "".join(json.dumps(r) + "\n" for r in result.rows))
    summary = finish(out, result)
    summary["data_position"] = data_position  # random: the step; sequential: window, epoch, ...
    summary.update(par.summary_columns(summary))
    summary["wall_time_s"] = time.perf_counter() - wall0
    write_json_atomic(out / "summary.json", summary)
    ckpt.write_manifest(out, list(FINAL_FILES), data_seal(result.data_dir))  # last: the folder is complete, sealed
    log.info("done: %s", json.dumps(summary))
    return summary


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge train",
        description="Train one run config; resumes from the newest valid checkpoint in the scratch folder. "
        "python -m mohge.train is the same command: the module torchrun and the train rule launch.",
        epilog="Several GPUs: torchrun --standalone --nproc_per_node=N -m mohge.train ... --gpus N. "
        "Exit status: 0 done, 2 config/checkpoint/data error, 3 non-finite loss, 4 disk full / permission "
        "denied / I/O error (the previous checkpoint is kept), 5 another process writes OUT or SCRATCH, "
        "6 another rank died or stalled past train.parallel.timeout_s, "
        "143 / 130 stopped by SIGTERM / SIGINT after checkpointing the current step (see docs/errors.md).",
    )
    ap.add_argument("--config", required=True, help="resolved run config (JSON, or YAML written by hand)")
    ap.add_argument(
        "--out",
        required=True,
        help="final outputs: model.safetensors, config.json, tokenizer.json, train_log.jsonl, summary.json",
    )
    ap.add_argument(
        "--scratch", help="resumable state: step_*/ checkpoints and the live train_log.jsonl (default OUT/.scratch)"
    )
    ap.add_argument(
        "--data",
        help="prepared data folder (python -m mohge.data); default: the config's data section, "
        "prepared into SCRATCH/data when missing",
    )
    ap.add_argument("--require-resume", action="store_true", help="fail instead of starting without a checkpoint")
    ap.add_argument(
        "--gpus",
        type=int,
        help="GPUs this run must see and use, checked against torchrun and CUDA (0: train on the CPU)",
    )
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    try:
        train(load_run_config(args.config), args.out, args.scratch, args.data, args.require_resume, args.gpus)
    except PeerLostError as err:
        if os.environ.get("MOHGE_DEBUG"):
            raise
        log.error("%s", err)
        logging.shutdown()
        os._exit(EXIT_PEER)  # not sys.exit: the broken process group's destructors would wait on the lost peer
    except (NonFiniteLossError, LaunchError, Stopped) as err:
        if os.environ.get("MOHGE_DEBUG"):
            raise
        log.error("%s", err)
        if isinstance(err, Stopped):
            return 128 + err.signum
        return EXIT_NONFINITE if isinstance(err, NonFiniteLossError) else EXIT_USER
    return EXIT_OK
