"""One training process of ``mohge bench step``: a run config's model trained by the trainer's own step, one step
per request, from the source tree it is told to import.

    python src/mohge/bench/step_worker.py --tree TREE --config CONFIG.json

Run as a file, not as a module of this package: it imports ``mohge`` from ``TREE/src`` (and ``mohge.kernels`` from
``TREE/kernels``), so that one bench can time two checkouts of the package, each in its own process. It uses only
what the trainer's loop uses (``setup_runtime``, ``set_deterministic``, the ``Replicated`` layout,
``build_optimizer``, ``trainer._step``, the log window's ``WindowMeter``), which every checkout has.

Protocol, one JSON object a line: the worker answers ``{"ready": ...}`` once built, then reads ``{"steps": n}``
and answers with the thread CPU seconds of each of the n steps and their losses; ``{"finish": true}`` answers the
sha256 of the weights and of the optimizer state; ``{"phases": n}`` the median milliseconds of each part of a step
over n repetitions (:func:`phase_times`; it moves the optimizer state, so it comes after ``finish``); ``{"ops":
true}`` the milliseconds of each aten op in one more step (:func:`op_times`); ``{"exit": true}`` or the end of its
input ends it. A step is what the trainer's loop does per step:
the forward, backward, clipping and AdamW step of ``mohge.train.trainer._step`` and the log window's bookkeeping,
with a log row every ``train.log_every`` steps. The batches are uniform random tokens of the run's shape
(``train.batch_size`` windows of ``data.seq_len`` + 1 tokens), seeded, so both processes read the same ones.
"""

from __future__ import annotations

import sys

# run as a file, its own folder is sys.path[0]: its neighbours (profile.py) would shadow the standard library's
if sys.path and sys.path[0] == __file__.rpartition("/")[0]:
    del sys.path[0]

import argparse
import hashlib
import importlib.abc
import importlib.util
import json
import random
import time
from pathlib import Path


class _KernelsOf(importlib.abc.MetaPathFinder):
    """``mohge.kernels`` from TREE/kernels (the package maps it there; an editable install would map it to its own
    checkout's)."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def find_spec(self, name, path=None, target=None):
        if name != "mohge.kernels":
            return None
        init = self.tree / "kernels" / "__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])


def _import_from(tree: Path) -> None:
    sys.path.insert(0, str(tree / "src"))
    sys.meta_path.insert(0, _KernelsOf(tree))
    import mohge

    where = Path(mohge.__file__).resolve()
    if not where.is_relative_to((tree / "src").resolve()):
        raise RuntimeError(f"mohge imported from {where}, not from {tree}/src")


def _digest(tensors) -> str:
    import torch

    h = hashlib.sha256()
    for t in tensors:
        if isinstance(t, torch.Tensor):
            h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, help="the checkout whose src/mohge and kernels/ to import")
    ap.add_argument("--config", required=True)
    ap.add_argument("--batches", type=int, default=8, help="distinct random batches, read in turn")
    args = ap.parse_args()
    tree = Path(args.tree).resolve()
    _import_from(tree)

    import numpy as np
    import torch

    from mohge.config import load_run_config
    from mohge.train import trainer
    from mohge.train.parallelism import Replicated
    from mohge.train.runtime import set_deterministic, setup_runtime
    from mohge.train.step import WindowMeter, bias_balanced, build_optimizer, lr_at

    cfg = load_run_config(args.config)
    tc = cfg.train
    rt = setup_runtime(tc, 0, cfg.model.d_model)
    if rt.device.type != "cpu" or rt.world != 1:
        raise RuntimeError("mohge bench step runs one CPU process per checkout")
    if tc.threads > 0:
        torch.set_num_threads(tc.threads)
    set_deterministic(True)
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    par = Replicated(cfg, rt, Path("/nonexistent-scratch"))
    model = par.build()
    opt = build_optimizer(model, tc, fused=False)
    model.train()
    biased = bias_balanced(model)
    S, V = cfg.data_config.seq_len, cfg.model.vocab_size
    gen = torch.Generator().manual_seed(tc.seed)
    batches = [torch.randint(0, V, (tc.batch_size, S + 1), generator=gen) for _ in range(args.batches)]
    meter, s = WindowMeter(), 0
    out = sys.stdout

    def say(obj) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    where = str(Path(sys.modules["mohge"].__file__).resolve())
    say({"ready": True, "mohge": where, "threads": torch.get_num_threads()})
    for line in sys.stdin:
        req = json.loads(line)
        if req.get("exit"):
            return 0
        if req.get("finish"):
            say({"weights_sha256": _digest(model.state_dict().values()), "optimizer_sha256": _opt_digest(opt, _digest)})
            continue
        if req.get("ops"):
            b = batches[s % len(batches)]
            say(op_times(trainer._step, s, par, opt, (b[:, :-1], b[:, 1:]), meter, biased, None))
            s += 1
            continue
        if "phases" in req:
            b = batches[0]
            say(phase_times(model, opt, cfg, b[:, :-1], b[:, 1:], int(req["phases"])))
            continue
        times, losses = [], []
        for _ in range(int(req["steps"])):
            b = batches[s % len(batches)]
            t0 = time.thread_time()
            vals = trainer._step(s, par, opt, (b[:, :-1], b[:, 1:]), meter, biased, None)
            meter.add_step(vals, tc.batch_size * S, 0.0)
            if (s + 1) % tc.log_every == 0:
                meter.row(s, lr_at(s, tc), cfg, rt, (s + 1) * tc.batch_size * S)
                meter = WindowMeter()
            times.append(time.thread_time() - t0)
            losses.append(vals["loss"])
            s += 1
        say({"times": times, "losses": losses})
    return 0


def op_times(step, *args) -> dict:
    """The thread CPU milliseconds and calls of each aten op in one call of ``step(*args)`` (a training step; on a
    CPU the backward runs on this thread), and the step's own milliseconds with the timer on."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    ms: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()

    class Timer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = time.thread_time_ns()
            out = func(*args, **(kwargs or {}))
            key = func.overloadpacket.__name__
            ms[key] += (time.thread_time_ns() - t0) / 1e6
            calls[key] += 1
            return out

    t0 = time.thread_time()
    with Timer():
        step(*args)
    return {"step_ms": 1e3 * (time.thread_time() - t0), "ops_ms": dict(ms), "calls": dict(calls)}


def phase_times(model, opt, cfg, x_BS, y_BS, reps: int) -> dict[str, float]:
    """Median thread CPU milliseconds of each part of a step, timed alone (forward and backward) on the inputs it
    sees in a forward of the batch: per block its attention (norm, QKV, RoPE, attention, output projection) and
    its MoE layer (norm, router with the aux losses, experts), the router alone, the attention kernel alone, the
    embedding, the head (final norm, LM head, cross-entropy), clipping with AdamW. Run after the timed steps: it
    moves the optimizer's state."""
    import statistics

    import torch
    import torch.nn.functional as F

    from mohge.model.losses import weighted_aux

    inputs = []
    hooks = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach())) for b in model.blocks]
    with torch.no_grad():
        final = model.hidden(x_BS)[0].detach()
    for h in hooks:
        h.remove()
    cos, sin = model.rope_cos, model.rope_sin
    B, S, D = final.shape
    H = model.blocks[0].attn.H
    parts = {"embedding": lambda: model.embed(x_BS).sum().backward()}
    for i, block in enumerate(model.blocks):
        x = inputs[i].clone().requires_grad_(True)

        def attention(block=block, x=x):
            block.attn(block.attn_norm(x), cos, sin).sum().backward()

        def moe(block=block, x=x):
            y, st = block.ffn(block.ffn_norm(x))
            (y.sum() + weighted_aux(st.aux, cfg.loss, 0, cfg.train.steps)).backward()

        def router(block=block, x=x):
            h = block.ffn_norm(x).detach().reshape(B * S, D)
            r = block.ffn.router(h)
            (r.gates_TK.sum() + weighted_aux(block.ffn.aux_losses(r), cfg.loss, 0, cfg.train.steps)).backward()

        parts[f"attention.{i}"], parts[f"moe.{i}"], parts[f"router.{i}"] = attention, moe, router
    qkv = [torch.randn(B, H, S, D // H, requires_grad=True) for _ in range(3)]
    parts["attention_kernel"] = lambda: F.scaled_dot_product_attention(*qkv, is_causal=True).sum().backward()
    h = final.clone().requires_grad_(True)

    def head():
        F.cross_entropy(model.logits(model.norm(h)).float().flatten(0, 1), y_BS.flatten()).backward()

    def optimizer():
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip or float("inf"))
        opt.step()

    parts["head"], parts["optimizer"] = head, optimizer
    times: dict[str, list[float]] = {k: [] for k in parts}
    for r in range(reps + 1):
        for name, fn in parts.items():
            if name == "optimizer":
                for p in model.parameters():
                    p.grad = torch.full_like(p, 1e-3)
            t0 = time.thread_time()
            fn()
            if r:
                times[name].append(time.thread_time() - t0)
            model.zero_grad(set_to_none=True)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def _opt_digest(opt, digest) -> str:
    state = opt.state_dict()["state"]
    return digest(v for k in sorted(state) for _, v in sorted(state[k].items()))


if __name__ == "__main__":
    sys.exit(main())
