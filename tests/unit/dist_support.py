"""Support of the distributed tests: torchrun launches, and the single-process reference they are held to.

The reference trains one process the way a parallel layout of W data-parallel ranks must: at step s the
gradient is the mean of every rank's mean micro-batch loss on that rank's disjoint part of the data
(random order: :func:`mohge.train.distributed.trainer.rank_stream`; sequential order: the r-th ``batch_size`` of the
next ``batch_size x W`` windows), clipped by the global norm, then one AdamW step.
``worlds[s]`` is W at step s, so a run resumed on another world size has a reference too.
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from conftest import tiny_run

from mohge.config import RunConfig
from mohge.data import TokenStream
from mohge.model import LanguageModel
from mohge.train.distributed.trainer import rank_stream
from mohge.train.step import build_optimizer, compute_loss, lr_at

DATA = {"source": "graded", "vocab_size": 300, "seq_len": 16, "graded_num_docs": 120}
WORKER = Path(__file__).with_name("dist_worker.py")


def run_dict(steps: int, **parallel) -> dict:
    """A tiny MoHGE run (2 MoE layers, 4 width classes x 2 experts) with a ``train.parallel`` section; a deep
    copy, so a test may edit it (``tiny_run`` shares nested sections with conftest's TINY_RUN)."""
    return copy.deepcopy(
        tiny_run(
            train={
                "steps": steps,
                "batch_size": 4,
                "grad_accum": 2,
                "log_every": 1,
                "ckpt_every": 2,
                "keep_checkpoints": 3,
                "parallel": parallel,
            },
            data=DATA,
        )
    )


def write(path: Path, run: dict) -> Path:
    path.write_text(json.dumps(run))
    return path


def torchrun(nproc: int, args: list[str], timeout: int = 150, **kw) -> subprocess.CompletedProcess:
    """``torchrun --standalone`` in its own session, so a hung launch is killed with all its workers."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stdout[-2000:] + stderr[-4000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def train_args(config: Path, out: Path, data: Path, *extra: str) -> list[str]:
    return ["-m", "mohge.train", "--config", str(config), "--out", str(out), "--data", str(data), *extra]


def log_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def reference(cfg: RunConfig, data_dir: Path, worlds: list[int]) -> dict:
    """Losses, pre-clip gradient norms, step-0 gradients and final weights of the single-process reference."""
    tc, S = cfg.train, cfg.data_config.seq_len
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = LanguageModel(cfg.model, cfg.loss)
    opt = build_optimizer(model, tc)
    stream = TokenStream.open(data_dir, "train")
    micro = tc.batch_size // tc.grad_accum
    out: dict = {"loss": [], "grad_norm": []}
    window = 0  # sequential order: the global window position, which carries over a change of world size
    for s, world in enumerate(worlds):
        for group in opt.param_groups:
            group["lr"] = lr_at(s, tc)
        loss = 0.0
        for r in range(world):
            if tc.data_order == "sequential":
                x_BS, y_BS = stream.window_batch(window + r * tc.batch_size, tc.batch_size, S, tc.seed)
            else:
                x_BS, y_BS = rank_stream(stream, r, world, S).get_batch(s, tc.batch_size, S, tc.seed * 1000 + r)
            for m in range(tc.grad_accum):
                total, *_ = compute_loss(
                    model, x_BS[m * micro : (m + 1) * micro], y_BS[m * micro : (m + 1) * micro], cfg, s
                )
                (total / (tc.grad_accum * world)).backward()
                loss += total.item() / (tc.grad_accum * world)
        if s == 0:
            out["grads0"] = {k: p.grad.clone() for k, p in model.named_parameters()}
        out["grad_norm"].append(torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip).item())
        out["loss"].append(loss)
        window += tc.batch_size * world
        opt.step()
        opt.zero_grad(set_to_none=True)
    out["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.set_num_threads(threads)
    return out


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)
