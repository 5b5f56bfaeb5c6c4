"""Training: AdamW with linear warmup and cosine decay, clipping, accumulation, aux losses, DDP, resume.

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
  tokenizer.json match meta.json's sha256 (:func:`mohge.train.setup.check_data`: at every start and resume,
  re-hashing the files whose size, mtime or ctime changed) and their sizes (on every open), tokenizer.json round-trips.
* OUT is sealed last by manifest.json (sha256 of each file, and the sha256 of the data folder's meta.json and
  tokenizer.json it was trained on); exit codes are mohge.core.cli's (docs/errors.md).
* SIGTERM / SIGINT (mohge.train.runtime.GracefulStop): the current step finishes, every rank checkpoints that step,
  the locks are released and the command exits 128 + the signal's number with one line; the run resumes.

Log rows (SCRATCH/train_log.jsonl while running, each appended whole; copied to OUT at the end; on resume cut back
to the checkpoint's step, whose window sums travel in the checkpoint), one per ``log_every`` steps:
``step`` is the 0-based index of the last step of the window; losses are means over the window (all ranks);
``aux`` the raw aux losses (no coefficient) summed over layers, ``aux_layers`` per layer; per MoE layer
``group_usage`` = routed slots per width class / all slots, ``mean_expert_width`` = sum_e share_e * width_e
(the mean width of one routed slot) and ``activated_expert_width`` = topk * that (routed FFN width per token); the load
``expert_load`` = max / mean of the routed slots over experts (1: even), ``unused_experts`` (under 1 % of a uniform
share), and ``rank_flops`` = max / mean routed FLOPs per rank of the config's placement at ``rank_flops_ep`` ranks
(mohge.model.moe.routing_summary). The progress line shows the worst layer's three.

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
from mohge.core.cli import EXIT_NONFINITE, EXIT_OK, EXIT_PEER, EXIT_USER, setup_logging, user_errors
from mohge.data import TokenStream
from mohge.data.stream import TrainBatches
from mohge.model import LanguageModel

from . import checkpoint as ckpt
from .heldout import heldout_loss
from .runtime import (
    GracefulStop,
    LaunchError,
    PeerLostError,
    Runtime,
    Stopped,
    peer_failure,
    set_deterministic,
    setup_runtime,
    wrap_ddp,
)
from .setup import FINAL_FILES, check_data, data_seal, finish, resolve_data
from .step import (
    NonFiniteLossError,
    WindowMeter,
    bias_balanced,
    build_optimizer,
    compute_loss,
    lr_at,
    optimizer_step,
    progress,
    read_log,
    set_global_balance,
    update_expert_bias,
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
        run = _train
        if rt.world > 1 and cfg.train.parallel is not None:  # FSDP2 / expert parallelism: mohge.train.distributed
            from .distributed.trainer import train_parallel as run
        with contextlib.ExitStack() as locks:
            stop = locks.enter_context(GracefulStop().installed())
            if rt.main:  # one writer per output: a second training on the same folders is refused
                for folder in (out, scratch):
                    locks.enter_context(output_lock(folder, log))
            try:
                return run(cfg, out, scratch, data, require_resume, rt, stop)
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


def _train(
    cfg: RunConfig,
    out: Path,
    scratch: Path,
    data: str | None,
    require_resume: bool,
    rt: Runtime,
    stop: GracefulStop | None = None,
) -> dict:
    wall0, tc = time.perf_counter(), cfg.train
    stop = stop or GracefulStop()
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    scratch.mkdir(parents=True, exist_ok=True)
    data_dir = resolve_data(cfg, data, scratch, rt)
    if rt.main:  # before the first step: a broken tokenizer or changed token file is named, not trained on
        check_data(cfg, data_dir, scratch)
    rt.barrier()
    stream, S = TokenStream.open(data_dir, "train"), cfg.data_config.seq_len
    resolved = ckpt.resolved_config(cfg)
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = LanguageModel(cfg.model, cfg.loss).to(rt.device)
    opt = build_optimizer(model, tc, fused=rt.device.type == "cuda")

    state = ckpt.resume_point(scratch, resolved, rt.main, rt.world, rt.device, require_resume)
    start, last_good = 0, None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["state"]["optimizer"])
        rngs = state["state"]["rng"]
        ckpt.restore_rng(rngs[rt.rank] if len(rngs) == rt.world else rngs[0])
        start, last_good = state["step"], state["path"]
        log.info("resuming from %s (step %d of %d, data %s)", last_good, start, tc.steps, state["data"])
    batches = TrainBatches(
        stream,
        tc.data_order,
        tc.batch_size,
        S,
        tc.seed,
        rt.rank,
        rt.world,
        start,
        ckpt.start_window(state and state["data"], tc.data_order, last_good),
    )

    log_path = scratch / "train_log.jsonl"
    rows = read_log(log_path, start)
    if rt.main:
        write_text_atomic(log_path, "".join(json.dumps(r) + "\n" for r in rows))
    net: torch.nn.Module = model
    if rt.world > 1:
        net = wrap_ddp(model, rt)
    model.train()
    micro_B, tokens_per_step = tc.batch_size // tc.grad_accum, tc.batch_size * S * rt.world
    meters = state["state"].get("meters") if state is not None else None
    own = None if not meters else meters[rt.rank] if len(meters) == rt.world else meters[0]
    meter, trained_tokens, train_time = WindowMeter.from_state(own, rt.device), 0, 0.0

    def save(step: int) -> Path | None:
        rngs, meters = [ckpt.capture_rng()], [meter.state()]
        if rt.world > 1:
            rngs, meters = [None] * rt.world, [None] * rt.world
            dist.all_gather_object(rngs, ckpt.capture_rng())
            dist.all_gather_object(meters, meter.state())
        path = None
        if rt.main:
            train_state = {"optimizer": opt.state_dict(), "scheduler": {"step": step}, "rng": rngs, "meters": meters}
            path = ckpt.save_checkpoint(
                scratch, step, model.state_dict(), train_state, resolved, tc.keep_checkpoints, batches.position(step)
            )
        rt.barrier()
        return path

    tty = sys.stderr.isatty()  # in a log file, one progress line per 30 s instead of ten per second
    bar = tqdm(
        total=tc.steps, initial=start, disable=not rt.main, desc=cfg.name, unit="step", mininterval=0.1 if tty else 30
    )
    biased = bias_balanced(model)
    with bar, stop.in_loop():
        for s in range(start, tc.steps):
            t0 = time.perf_counter()
            lr = lr_at(s, tc)
            for group in opt.param_groups:
                group["lr"] = lr
            x_BS, y_BS = batches.batch(s)
            if cfg.loss.balance_stats == "global_batch":
                micro_x = [x_BS[m * micro_B : (m + 1) * micro_B].to(rt.device) for m in range(tc.grad_accum)]
                set_global_balance(model, micro_x, rt, rt.autocast)
            sums, step_counts = torch.zeros(3, device=rt.device), 0
            for m in range(tc.grad_accum):
                xm, ym = (t[m * micro_B : (m + 1) * micro_B].to(rt.device) for t in (x_BS, y_BS))
                sync = net.no_sync() if rt.world > 1 and m < tc.grad_accum - 1 else contextlib.nullcontext()
                with sync:
                    with torch.autocast(rt.device.type, dtype=rt.autocast, enabled=rt.autocast is not None):
                        total, lm, aux, layers = compute_loss(net, xm, ym, cfg, s)
                    (total / tc.grad_accum).backward()
                sums += torch.stack([total, lm, aux]).detach().float() / tc.grad_accum
                meter.add_micro(layers)
                if biased:
                    step_counts = step_counts + torch.stack([st.counts_E for st in layers])
            if rt.world > 1:
                dist.all_reduce(sums)
                sums /= rt.world
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip or float("inf"))
            vals = optimizer_step(s, sums, gnorm, opt, rt, last_good)
            if biased:
                update_expert_bias(biased, list(step_counts), rt)
            dt = time.perf_counter() - t0
            train_time += dt
            trained_tokens += tokens_per_step
            meter.add_step(vals, tokens_per_step, dt)
            bar.update(1)
            if (s + 1) % tc.log_every == 0 or s + 1 == tc.steps:
                row = meter.row(s, lr, cfg, rt, (s + 1) * tokens_per_step)
                if tc.data_order == "sequential":  # where the next step reads (epoch, shard, offset for humans)
                    row["data"] = batches.position(s + 1)
                meter = WindowMeter()
                if rt.main:
                    rows.append(row)
                    append_line(log_path, json.dumps(row))
                    bar.set_postfix(progress(row))
            if tc.eval_every and (s + 1) % tc.eval_every == 0:
                if rt.main:
                    val = heldout_loss(model, data_dir, "val", micro_B, S, tc.eval_batches, rt.autocast)
                    row = {"step": s, "val_loss": val["loss"], "val_ppl": val["ppl"]}
                    rows.append(row)
                    append_line(log_path, json.dumps(row))
                rt.barrier()
            signum = stop.requested(rt)  # SIGTERM / SIGINT on any rank: every rank checkpoints this step
            if (s + 1) % tc.ckpt_every == 0 or s + 1 == tc.steps or signum:
                last_good = save(s + 1)
            if signum:
                raise Stopped(signum, s + 1, last_good or scratch / ckpt.step_dir_name(s + 1))

    summary: dict[str, Any] = {}
    if rt.main:
        summary = finish(cfg, out, data_dir, model, rt, rows, resolved, start, micro_B, trained_tokens, train_time)
        summary["data_position"] = batches.position(tc.steps)  # random: the step; sequential: window, epoch, ...
        summary["wall_time_s"] = time.perf_counter() - wall0
        write_json_atomic(out / "summary.json", summary)
        ckpt.write_manifest(out, list(FINAL_FILES), data_seal(data_dir))  # last: the folder is complete, sealed
        log.info("done: %s", json.dumps(summary))
    rt.barrier()
    return summary


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mohge.train",
        description="Train one run config; resumes from the newest valid checkpoint in the scratch folder.",
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
