"""GPU check of training: bf16 steps of a small MoHGE with the Triton and the torch expert backends, and through
FSDP2 (a world of one: NCCL, bf16 parameters, fp32 reduction); loss parity, tokens/s and MFU.

    python -m mohge.train.distributed.gpu_check --out DIR [--steps 20] [--peak-tflops X]   (kernels/gpu_train_check.sh)

Variants, each from the same initial weights on the same batches (sequences that count up by a per-sequence
stride modulo V, so the loss falls steeply and parity is tested along a real descent):

* ``torch``:  one process, bf16 autocast, grouped-torch experts (the reference);
* ``triton``: one process, bf16 autocast, Triton expert kernels;
* ``fsdp2``:  Triton experts under :func:`mohge.train.distributed.parallelize.parallelize` (FSDP2 with
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, under bf16 autocast as the trainer runs it),
  a one-rank process group.

Parity, against ``torch``, where every variant still holds the same weights: the first step's loss within
``--rtol-step`` (default 1e-2: the forward) and its gradient norm within ``--rtol-grad`` (default 5e-2: the
backward). After that, bf16 rounding flips top-k choices and the trajectories part (three runs of ``torch`` alone on
an H200 differed by up to 5.3 % at one step: neither path is bitwise reproducible from run to run), so the descent is
compared as the mean loss of the last ``--tail`` steps (default 5), within ``--rtol`` (default 5e-2) of
``torch``'s, and below the first step's loss. Throughput: the steps after
``--warmup`` (Triton compiles and autotunes in the first ones), CUDA-synchronized; MFU against the peak
(``--peak-tflops``, default from the device name: 989 for H100/H200 bf16 dense, 312 for A100).
Writes DIR/train_check.json and DIR/train_check.csv (one row per variant). Exit status 1 when parity fails.
``--device cpu`` runs the torch and fsdp2 variants in fp32 on gloo (the unit test's smoke run).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mohge.config import FFNConfig, LossConfig, ModelConfig, RouterConfig
from mohge.core.atomic import write_json_atomic, write_text_atomic
from mohge.model import LanguageModel
from mohge.model.losses import weighted_aux

from .flops import model_flops_per_token
from .layout import Layout
from .mesh import build_meshes
from .parallelize import clip_grad_norm, parallelize

PEAKS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}


def check_model(backend: str, small: bool) -> ModelConfig:
    d, widths = (64, (32, 48, 64, 80)) if small else (512, (256, 512, 768, 1024))
    return ModelConfig(
        vocab_size=512 if small else 4096,
        d_model=d,
        n_layers=2 if small else 4,
        n_heads=4 if small else 8,
        max_seq_len=64 if small else 512,
        ffn=FFNConfig(
            kind="mohge",
            num_experts=16,
            expert_widths=widths,
            shared_expert_width=d,
            dense_layers=0,
            dense_width=d,
            backend=backend,
        ),
        router=RouterConfig(topk=4, group_topk=2),
    )


def batches(steps: int, batch: int, seq: int, vocab: int, device: torch.device) -> list[torch.Tensor]:
    """[B, S + 1] token windows: start + stride * t (mod V), start and stride random per sequence."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 8, (batch, 1), generator=g)
        out.append(((start + stride * torch.arange(seq + 1)) % vocab).to(device))
    return out


def run_variant(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    backend = "torch" if name == "torch" or device.type == "cpu" else "triton"
    model_cfg = check_model(backend, args.device == "cpu")
    loss_cfg = LossConfig()
    torch.manual_seed(0)
    model = LanguageModel(model_cfg, loss_cfg)
    autocast = device.type == "cuda"
    if name == "fsdp2":
        layout = Layout(1, 1, 1, 1, "none", args.peak_tflops or 0.0, ())  # a world of one rank
        # bf16 parameters from FSDP2's MixedPrecisionPolicy, under bf16 autocast as the trainer runs it (the norms,
        # softmaxes and losses in fp32)
        parallelize(model, layout, build_meshes(layout, device.type), device)
    else:
        model.to(device)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and not n.startswith("embed.")]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2 or n.startswith("embed.")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-3)
    seq = model_cfg.max_seq_len
    data = batches(args.steps, args.batch, seq, model_cfg.vocab_size, device)
    losses, grad_norms, times = [], [], []
    for s, window in enumerate(data):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(window[:, :-1])
            lm = F.cross_entropy(out.logits.float().flatten(0, 1), window[:, 1:].flatten())
            loss = lm + sum(weighted_aux(st.aux, loss_cfg, s, args.steps) for st in out.layers)
        loss.backward()
        if name == "fsdp2":
            gnorm = clip_grad_norm(model, 1.0, layout)
        else:
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(lm.item())  # .item() synchronizes
        grad_norms.append(gnorm.item())
        times.append(time.perf_counter() - t0)
    timed = times[args.warmup :]
    tokens_per_s = args.batch * seq * len(timed) / sum(timed)
    fpt = model_flops_per_token(model_cfg, seq)
    peak = args.peak_tflops
    return {
        "variant": name,
        "backend": backend,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "steps": args.steps,
        "tokens_per_step": args.batch * seq,
        "tokens_per_s": tokens_per_s,
        "model_flops_per_token": fpt,
        "peak_tflops": peak,
        "mfu": tokens_per_s * fpt / (peak * 1e12) if peak else None,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "losses": losses,
        "grad_norms": grad_norms,
    }


def _one_rank_group(device: torch.device) -> None:
    """A process group of one rank (FSDP2 needs one), unless torchrun started it."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_PORT" in os.environ:
        dist.init_process_group(backend, rank=0, world_size=1)
        return
    # one rank: a file store, no TCP port (a port probed free can be taken by another process before the bind)
    store = os.path.join(tempfile.mkdtemp(prefix="mohge-gpu-check-"), "store")
    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mohge.train.distributed.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5, help="untimed first steps (Triton compiles there)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rtol", type=float, default=5e-2, help="mean loss of the last --tail steps, relative")
    ap.add_argument("--rtol-step", type=float, default=1e-2, help="the first step's loss, relative")
    ap.add_argument("--rtol-grad", type=float, default=5e-2, help="the first step's gradient norm, relative")
    ap.add_argument("--tail", type=int, default=5, help="steps averaged for the descent's comparison")
    ap.add_argument("--peak-tflops", type=float, help="one device's bf16 peak (default: from the device name)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 1
    device = torch.device(args.device)
    if args.device == "cuda":
        torch.cuda.set_device(0)
        name = torch.cuda.get_device_name(0)
        args.peak_tflops = args.peak_tflops or next((v for k, v in PEAKS.items() if k in name), None)
    args.warmup = min(args.warmup, args.steps - 1)
    _one_rank_group(device)
    variants = ("torch", "triton", "fsdp2") if args.device == "cuda" else ("torch", "fsdp2")
    rows = [run_variant(v, args, device) for v in variants]
    tail = min(args.tail, args.steps)
    ref = rows[0]
    for r in rows:
        r["tail_loss"] = sum(r["losses"][-tail:]) / tail
        r["first_loss_rel_diff"] = rel(r["first_loss"], ref["first_loss"])
        r["first_grad_norm_rel_diff"] = rel(r["grad_norms"][0], ref["grad_norms"][0])
        r["tail_loss_rel_diff"] = rel(r["tail_loss"], ref["tail_loss"])
        r["max_step_rel_diff"] = max(rel(a, b) for a, b in zip(r["losses"], ref["losses"], strict=True))
        r["ok"] = (
            r["first_loss_rel_diff"] <= args.rtol_step
            and r["first_grad_norm_rel_diff"] <= args.rtol_grad
            and r["tail_loss_rel_diff"] <= args.rtol
            and r["tail_loss"] < r["first_loss"]
        )
        print(
            f"{r['variant']:>7}: loss {r['first_loss']:.4f} -> {r['final_loss']:.4f} "
            f"(last {tail} {r['tail_loss']:.4f}),"
            f" vs torch: first loss {r['first_loss_rel_diff']:.1e}, first grad norm "
            f"{r['first_grad_norm_rel_diff']:.1e}, last {tail} {r['tail_loss_rel_diff']:.1e} (largest at one step "
            f"{r['max_step_rel_diff']:.1e}); {r['tokens_per_s']:.0f} tokens/s, MFU {r['mfu']}"
            + ("" if r["ok"] else "  FAILED")
        )
    ok = all(r["ok"] for r in rows)
    tolerances = {"rtol": args.rtol, "rtol_step": args.rtol_step, "rtol_grad": args.rtol_grad, "tail": tail}
    write_json_atomic(args.out / "train_check.json", {"ok": ok, **tolerances, "variants": rows})
    buf = io.StringIO()
    fields = [k for k in rows[0] if k not in ("losses", "grad_norms")]
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(args.out / "train_check.csv", buf.getvalue())
    dist.destroy_process_group()
    print(f"gpu_check train: {'parity ok' if ok else 'PARITY FAILED'} ({tolerances})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
