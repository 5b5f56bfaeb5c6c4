"""Does ``torch.compile`` pay for a run's training on this CPU? One run config's model, trained eager and compiled.

    mohge bench compile --config results/default/runs/shakespeare-mohge-s0/config.json \\
        --json results/bench/compile_cpu.json

Both trainers start from the same weights on the same fixed batch of the run's shape (``train.batch_size`` x
``data.seq_len``), with the step of ``mohge bench train`` (:class:`.train.Trainer`: forward, loss with
the auxiliary losses, backward, clipping, AdamW). The compiled one wraps the model in ``torch.compile`` (inductor,
its default mode); the optimizer stays eager in both. Measured in one run:

* the compile cost: the wall time of the compiled trainer's first ``--warmup`` steps (compilation runs there, partly
  in inductor's worker processes, so the wall clock is the only one that sees it) minus the eager trainer's, with an
  empty inductor cache (a fresh directory: what a first run on a fresh machine pays), or with the existing one
  (``--warm-cache``: what a later run of the same shapes pays);
* the steady step: single steps of the two alternate (the order flips every round), median of ``--steps``, timed by
  the thread's CPU time with one torch thread;
* the first step's loss of each (a check that both run the same computation);
* the break-even: the steps after which compilation has paid for itself, against the run's ``train.steps``.

``pays`` is true only where the compiled step is faster and the break-even comes before the run's last step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence

import torch

from mohge.config import load_run_config
from mohge.core.atomic import write_json_atomic

from .step import host
from .train import Trainer


def payoff(compile_s: float, eager_s: float, compiled_s: float, run_steps: int) -> tuple[float | None, bool]:
    """(break-even steps, pays): the steps whose saving repays ``compile_s`` (None if the compiled step is not
    faster), and whether that comes before a run of ``run_steps`` steps ends."""
    saving = eager_s - compiled_s
    if saving <= 0:
        return None, False
    steps = max(compile_s, 0.0) / saving
    return steps, steps < run_steps


def measure(model_cfg, batch: int, seq: int, run_steps: int, steps: int, warmup: int) -> dict:
    """The compile cost, the steady steps of both trainers and the break-even against ``run_steps``."""
    trainers = {name: Trainer(model_cfg, batch, seq, compiled=name == "compiled") for name in ("eager", "compiled")}
    first_loss, warm_wall = {}, {}
    for name, t in trainers.items():
        t0 = time.perf_counter()
        first_loss[name] = t.step().item()
        for _ in range(warmup - 1):
            t.step()
        warm_wall[name] = time.perf_counter() - t0
        print(f"  {name:<8} first {warmup} steps: {warm_wall[name]:7.1f} s wall (loss {first_loss[name]:.6f})")
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for r in range(steps):
        for name in sorted(trainers, reverse=bool(r % 2)):
            times[name].append(trainers[name].run(1))
    step_s = {name: statistics.median(ts) for name, ts in times.items()}
    compile_s = warm_wall["compiled"] - warm_wall["eager"]
    break_even, pays = payoff(compile_s, step_s["eager"], step_s["compiled"], run_steps)
    return {
        "bench": "compile",
        "step_seconds": step_s,
        "ratio_compiled_over_eager": step_s["compiled"] / step_s["eager"],
        "compile_seconds": compile_s,
        "warmup_wall_seconds": warm_wall,
        "first_loss": first_loss,
        "first_loss_rel_diff": abs(first_loss["compiled"] - first_loss["eager"]) / abs(first_loss["eager"]),
        "break_even_steps": break_even,
        "run_steps": run_steps,
        "pays": pays,
        "times": times,
        "setup": {"batch": batch, "seq": seq, "timed_steps": steps, "warmup_steps": warmup},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "clock": "thread_time" if torch.get_num_threads() == 1 else "wall",
        "loadavg": list(os.getloadavg()),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "host": host(),
    }


@contextlib.contextmanager
def _env(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench compile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a resolved run config (results/<study>/runs/<run>/config.json)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per trainer, alternating between them")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps per trainer (compilation runs there)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time clock; 0 = torch's default)")
    ap.add_argument("--warm-cache", action="store_true", help="keep inductor's existing cache (default: an empty one)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be at least 1")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = load_run_config(args.config)
    batch, seq = cfg.train.batch_size // cfg.train.grad_accum, cfg.data_config.seq_len
    model_cfg = dataclasses.replace(cfg.model, max_seq_len=max(cfg.model.max_seq_len, seq))
    print(f"compile benchmark: {args.config}, batch {batch} x {seq} tokens, torch {torch.__version__}")
    with contextlib.ExitStack() as stack:
        if not args.warm_cache:  # inductor reads it when it first compiles, inside measure()
            cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="mohge-inductor-"))
            stack.enter_context(_env("TORCHINDUCTOR_CACHE_DIR", cache))
        res = {"config": str(args.config), **measure(model_cfg, batch, seq, cfg.train.steps, args.steps, args.warmup)}
    res["inductor_cache"] = "existing" if args.warm_cache else "empty"
    s = res["step_seconds"]
    be = res["break_even_steps"]
    print(
        f"step: eager {1e3 * s['eager']:.1f} ms, compiled {1e3 * s['compiled']:.1f} ms "
        f"(compiled / eager {res['ratio_compiled_over_eager']:.3f}); compile cost {res['compile_seconds']:.1f} s; "
        + (f"pays after {be:.0f} steps" if be is not None else "never pays")
        + f" (the run trains {res['run_steps']} steps): {'pays' if res['pays'] else 'does not pay'}"
    )
    if args.json:
        write_json_atomic(args.json, res)
    return 0
