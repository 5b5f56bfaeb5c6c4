"""One training process of ``mohge bench step``: a run config's model trained by the trainer's own step, one step
per request, from the source tree it is told to import.

    python src/mohge/bench/step_worker.py --tree TREE --config CONFIG.json

Run as a file, not as a module of this package: it imports ``mohge`` from ``TREE/src`` (and ``mohge.kernels`` from
``TREE/kernels``), so that one bench can time two checkouts of the package, each in its own process. It uses only
what the trainer's loop uses (``setup_runtime``, ``set_deterministic``, the ``Replicated`` layout,
``build_optimizer``, ``trainer._step``, the log window's ``WindowMeter``), which every checkout has.

Protocol, one JSON object a line: the worker answers ``{"ready": ...}`` once built, then reads ``{"steps": n}``
and answers with the thread CPU seconds of each of the n steps and their losses; ``{"finish": true}`` answers the
sha256 of the weights and of the optimizer state, and ends it. A step is what the trainer's loop does per step:
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
        if req.get("finish"):
            say({"weights_sha256": _digest(model.state_dict().values()), "optimizer_sha256": _opt_digest(opt, _digest)})
            return 0
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
    return 1


def _opt_digest(opt, digest) -> str:
    state = opt.state_dict()["state"]
    return digest(v for k in sorted(state) for _, v in sorted(state[k].items()))


if __name__ == "__main__":
    sys.exit(main())
