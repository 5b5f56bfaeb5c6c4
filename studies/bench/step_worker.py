"""One training process of ``mohge bench step``: a run config's model trained by the trainer's own step, one step
per request, from the source tree it is told to import.

    python studies/bench/step_worker.py --tree TREE --config CONFIG.json

Run as a file, not as a module of this package: it imports ``mohge`` from ``TREE/src`` (and ``mohge.kernels`` from
``TREE/kernels``), so that one bench can time two checkouts of the package, each in its own process. It uses only
what the trainer's loop uses (``setup_runtime``, ``set_deterministic``, the ``Replicated`` layout,
``build_optimizer``, ``trainer._step``, the log window's ``WindowMeter``), which every checkout has.

Protocol, one JSON object a line: the worker answers ``{"ready": ...}`` once built, then reads ``{"steps": n}``
and answers with the thread CPU seconds of each of the n steps and their losses; ``{"finish": true}`` answers the
sha256 of the weights and of the optimizer state; ``{"parts": n}`` the median milliseconds of each part of n more
steps (:func:`part_times`); ``{"kernels": n}`` the milliseconds a step of each op and compiled kernel by the profiler
over n more steps (:func:`kernel_times`); ``{"ops":
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
    if getattr(tc, "fused", False):  # a tree without the knob trains eager
        from mohge.train.step import use_fused_path

        use_fused_path(model, tc)
    try:  # the trainer's choice of update; a tree without it: fused only when asked for
        from mohge.train.step import fused_adamw

        fused = fused_adamw(tc, torch.device("cpu"))
    except ImportError:
        fused = getattr(tc, "adamw", "auto") == "fused"  # a tree without the knob: foreach
    opt = build_optimizer(model, tc, fused=fused)
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
        if "parts" in req or "kernels" in req:
            state = {"s": s}

            def one_step(state=state, meter=meter):
                b = batches[state["s"] % len(batches)]
                trainer._step(state["s"], par, opt, (b[:, :-1], b[:, 1:]), meter, biased, None)
                state["s"] += 1

            if "parts" in req:
                say(part_times(model, opt, par, meter, one_step, int(req["parts"])))
            else:
                say(kernel_times(one_step, int(req["kernels"])))
            s = state["s"]
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


def dispatch_timer() -> type:
    """The base of this worker's op timers: a ``TorchDispatchMode`` under which the graphs ``torch.compile`` made (the
    fused path's) run compiled, as a whole, unseen op by op (``ignore_compile_internals``). Without it torch.compile
    skips every function it meets under the mode and runs them eagerly for the rest of the process: the fused path's
    profiles, and its kernels profiled after them, would be of its eager ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CompiledStaysCompiled(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

    return CompiledStaysCompiled


def op_times(step, *args) -> dict:
    """The thread CPU milliseconds and calls of each aten op in one call of ``step(*args)`` (a training step; on a
    CPU the backward runs on this thread), and the step's own milliseconds with the timer on. A compiled graph's ops
    are not among them (:func:`dispatch_timer`): its time is in the step's."""
    import collections

    ms: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()

    class Timer(dispatch_timer()):
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


def kernel_times(step, reps: int) -> dict:
    """Where ``reps`` calls of ``step`` (training steps) spend their time, by torch's profiler: the self milliseconds a
    step of each aten op, custom op (``mohge::``), compiled kernel (inductor's C++ kernels, named ``graph_<n>_cpp_...``
    where the process runs with ``TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1``, as ``mohge bench step --kernels`` starts
    it) and autograd or compiled-graph node (its Python and the calls it makes outside the dispatcher: the ctypes
    kernels of ``mohge.model.native``), with their calls a step; ``step_ms`` the step's thread CPU milliseconds with the
    profiler on. Self times are the profiler's, the wall clock of this one-thread process."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.thread_time()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            step()
    step_ms = 1e3 * (time.thread_time() - t0) / reps
    events = prof.key_averages()
    return {
        "step_ms": step_ms,
        "self_ms": {e.key: e.self_cpu_time_total / 1e3 / reps for e in events},
        "calls": {e.key: e.count / reps for e in events},
    }


PARTS = ("embedding", "attention", "attention kernel", "router", "experts", "head and loss", "optimizer", "other")


def part_times(model, opt, par, meter, step, reps: int) -> dict[str, float]:
    """Where a training step's time goes: the thread CPU milliseconds of every aten op of ``reps`` calls of ``step``
    (the trainer's own step, forward, backward and optimizer), each op charged to the part of the model it computes,
    the median over the calls. Forward ops go to the module they run in; backward ops to the module whose forward made
    the autograd node that runs them (``torch._C._current_autograd_node``, the nodes labelled by walking each module's
    output graph when its forward ends, innermost module first).

    Parts (:data:`PARTS`): ``embedding``; ``attention`` (its norm, QKV, RoPE, the attention kernel, the output
    projection), ``attention kernel`` the kernel alone (inside ``attention``); ``router`` (the MoE layer's norm, router,
    aux losses and counts); ``experts`` (sort, gather, GEMMs, SwiGLU, combine); ``head and loss`` (final norm, LM head,
    cross-entropy and the sums of the loss, the step's glue); ``optimizer`` (clipping, AdamW, zeroing); ``other``
    (residual adds, gradient accumulation into the leaves, the log window). ``aten`` is their sum, ``step`` the step's
    own milliseconds with the timer on (the difference is Python and the timer). On the fused path (``train.fused``) the
    difference also holds its compiled graphs, which run compiled (:func:`dispatch_timer`: the blocks' attention halves,
    the routers) and its ctypes kernels: ``--kernels`` names them."""
    import collections
    import statistics

    import torch

    from mohge.model.moe import MoELayer

    labels: dict[int, str] = {}
    keep: list = []  # the labelled nodes, alive until the backward ran (their ids stay theirs)
    stack: list[str] = []

    def label_graph(out, part: str) -> None:
        todo = [t.grad_fn for t in _tensors(out)]
        while todo:
            node = todo.pop()
            if node is None or id(node) in labels or type(node).__name__ == "AccumulateGrad":
                continue
            labels[id(node)] = part
            keep.append(node)
            todo.extend(n for n, _ in node.next_functions)

    def enter(part):
        return lambda module, args: stack.append(part)

    def leave(part):
        def hook(module, args, out):
            stack.pop()
            label_graph(out, part)

        return hook

    modules = [(model.embed, "embedding"), (model.norm, "head and loss")]
    if model.head is not None:
        modules.append((model.head, "head and loss"))
    for block in model.blocks:
        modules += [(block.attn_norm, "attention"), (block.attn, "attention"), (block.ffn_norm, "router")]
        if isinstance(block.ffn, MoELayer):
            modules += [(block.ffn.router, "router"), (block.ffn.experts, "experts"), (block.ffn, "router")]
        else:
            modules.append((block.ffn, "experts"))
        modules.append((block, "other"))
    hooks = [h for m, part in modules for h in (m.register_forward_pre_hook(enter(part)),
                                                  m.register_forward_hook(leave(part)))]  # fmt: skip
    # the fused path runs a MoE layer's experts by a function of its own (no experts module): labelled as the hooks do
    fused = sys.modules.get("mohge.model.fused")
    fused_experts = getattr(fused, "experts", None)

    def experts(bank, *args):
        stack.append("experts")
        try:
            out = fused_experts(bank, *args)
        finally:
            stack.pop()
        label_graph(out, "experts")
        return out

    if fused_experts is not None:
        fused.experts = experts
    ms: dict[str, float] = collections.defaultdict(float)

    class Timer(dispatch_timer()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = time.thread_time_ns()
            out = func(*args, **(kwargs or {}))
            dt = (time.thread_time_ns() - t0) / 1e6
            node = torch._C._current_autograd_node()
            if node is not None:
                part = labels.get(id(node), "other" if type(node).__name__ == "AccumulateGrad" else "head and loss")
            else:
                part = stack[-1] if stack else label[0]
            ms[part] += dt
            if "scaled_dot_product" in func.__name__:
                ms["attention kernel"] += dt
            return out

    label = ["head and loss"]

    def labelled(part, fn):
        def run(*args, **kwargs):
            label[0] = part
            try:
                return fn(*args, **kwargs)
            finally:
                label[0] = "head and loss"

        return run

    saved = opt.step, opt.zero_grad, par.clip_grad_norm, meter.add_micro
    opt.step, opt.zero_grad = labelled("optimizer", opt.step), labelled("optimizer", opt.zero_grad)
    par.clip_grad_norm, meter.add_micro = labelled("optimizer", par.clip_grad_norm), labelled("other", meter.add_micro)
    runs: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for _ in range(reps):
            ms.clear()
            labels.clear()
            keep.clear()
            t0 = time.thread_time()
            with Timer():
                step()
            runs["step"].append(1e3 * (time.thread_time() - t0))
            for part in PARTS:
                runs[part].append(ms.get(part, 0.0))
            runs["aten"].append(sum(v for k, v in ms.items() if k != "attention kernel"))
    finally:
        for h in hooks:
            h.remove()
        if fused_experts is not None:
            fused.experts = fused_experts
        opt.step, opt.zero_grad, par.clip_grad_norm, meter.add_micro = saved
    return {k: statistics.median(v) for k, v in runs.items()}


def _tensors(out):
    import torch

    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, tuple | list):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)
    elif hasattr(out, "__dataclass_fields__"):  # LayerStats: its aux losses
        yield from _tensors(vars(out))


def _opt_digest(opt, digest) -> str:
    state = opt.state_dict()["state"]
    return digest(v for k in sorted(state) for _, v in sorted(state[k].items()))


if __name__ == "__main__":
    sys.exit(main())
