"""Training tokens/s of this checkout against a baseline commit, on run configs of a study, in one interleaved run.

    mohge bench step --baseline REV [--config results/capacity/runs/<run>/config.json ...] [--set KEY=VALUE ...] \\
        [--steps 20] [--repeats 3] [--warmup 3] [--parts 7] [--kernels 0] [--json results/bench/train_small_cpu.json]

For each run config, processes train the same model from the same seed on the same random batches with the trainer's
own step (:mod:`.step_worker`): one imports the package from ``--baseline`` (a commit, read with ``git
archive`` into a temporary folder, or ``--baseline-tree``: a folder), one from this checkout, and a third the baseline
again, a control: the ratio of the two baseline processes is the noise of the measurement (two processes of the same
code differ, on a shared machine, by where they land). After ``--warmup`` steps each, single steps go round the three
(the order rotates every round), each timed by its own process's thread CPU time (one torch thread), so the load of
other processes hits all alike; ``--repeats`` times with fresh processes, the steps pooled; tokens/s = tokens a step /
median step time. Processes, not one: a change may set up the process (the allocator, for one), which a baseline in
the same process would share.

With ``--set train.fused=true`` (repeatable) this checkout's process trains the run config with that knob set
(an opt-in of new runs), the baseline and the control the config as it is; the record keeps the sets and each
process's wall time of its warmup steps (a compile's cost lands there).

Every process also reports every step's loss and, at the end, a digest of its weights and optimizer state, so the
record says whether this checkout trains the baseline's numbers bit for bit (``identical``). Then (``--parts``) the
baseline and this checkout each profile more steps: where a step's time goes, part by part, and op by op; and
(``--kernels``) by torch's profiler, which also sees the compiled graphs' kernels of the fused path by name (every
process then runs with inductor's kernel profile on): the self milliseconds a step of each op, kernel and node, summed
into GEMMs, compiled kernels, custom ops, other aten ops and the rest (:func:`kernel_groups`).

The default configs are the capacity study's (studies/capacity/config.yaml): at d_model 32 MoHGE (product_renorm gate),
MoE-15 and MoE-12; at d_model 64 MoHGE and MoE-15.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from mohge.core.atomic import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("step_worker.py")
RUNS = "results/capacity/runs"
DEFAULT_CONFIGS = (
    f"{RUNS}/facts-mohge-best_renorm_lr5e3-s10/config.json",
    f"{RUNS}/facts-moe-best_lr5e3-s10/config.json",
    f"{RUNS}/facts-moe_equal-best_lr5e3-s10/config.json",
    f"{RUNS}/facts_d64-mohge-best_renorm_lr5e3_d64-s10/config.json",
    f"{RUNS}/facts_d64-moe-best_lr5e3_d64-s10/config.json",
)


class Worker:
    """A :mod:`~mohge_studies.bench.step_worker` process on ``tree``, trained one request at a time."""

    def __init__(self, tree: Path, config: Path, kernel_names: bool = False) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if kernel_names:  # inductor's kernels call the profiler's hooks by name (read when inductor is imported)
            env["TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--tree", str(tree), "--config", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bench worker stopped (exit status {self.proc.wait()})")
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(json.dumps({"exit": True}) + "\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


ROLES = ("baseline", "control", "new")  # control: the baseline's package again, in a process of its own

GEMMS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm")
KERNEL_GROUPS = ("GEMMs", "compiled kernels", "custom ops", "other aten ops", "Python and nodes")


def kernel_group(key: str) -> str:
    """Which of :data:`KERNEL_GROUPS` a profiler key belongs to: the matrix products (:data:`GEMMS`), inductor's
    kernels (``graph_<n>_cpp_...``), our custom ops (``mohge::``), every other aten op, and the rest (autograd and
    compiled-graph nodes, the optimizer's step, dynamo's guards: Python, and what runs outside the dispatcher)."""
    if key in GEMMS:
        return "GEMMs"
    if key.startswith("graph_") and "_cpp_" in key:
        return "compiled kernels"
    if key.startswith("mohge::"):
        return "custom ops"
    return "other aten ops" if key.startswith("aten::") else "Python and nodes"


def kernel_groups(kernels: dict) -> dict[str, float]:
    """A :func:`~mohge_studies.bench.step_worker.kernel_times` answer summed by :func:`kernel_group`, ms a step."""
    out = dict.fromkeys(KERNEL_GROUPS, 0.0)
    for key, ms in kernels["self_ms"].items():
        out[kernel_group(key)] += ms
    return out


def measure_config(
    base: Path,
    new: Path,
    config: Path,
    steps: int,
    warmup: int,
    parts: int = 0,
    repeats: int = 1,
    new_config: Path | None = None,
    kernels: int = 0,
) -> dict:
    """Both trees on one run config, ``repeats`` times with fresh processes: three processes each time (the baseline,
    the baseline again as a control of the noise, this checkout, which trains ``new_config`` where given: the run
    config with this checkout's knobs set), single steps in turn (the order rotates every round); the step times, the
    losses and the final digests of each; then in the last repeat (``parts`` > 0) where the time of a step goes, part
    by part (the median of that many more steps of each, interleaved), and op by op (one more step); and (``kernels`` >
    0) by the profiler over that many more steps of each (:func:`kernel_groups`)."""
    from mohge.config import load_run_config

    cfg = load_run_config(config)
    tokens = cfg.train.batch_size * cfg.data_config.seq_len
    times: dict[str, list[float]] = {name: [] for name in ROLES}
    warmup_wall: dict[str, list[float]] = {name: [] for name in ROLES}
    per_repeat, identical, parts_ms, ops, final, kernel_ms = [], True, {}, {}, {}, {}
    for rep in range(repeats):
        workers: dict[str, Worker] = {}
        try:
            named = kernels > 0
            workers = {
                name: Worker(new, new_config or config, named) if name == "new" else Worker(base, config, named)
                for name in ROLES
            }
            mine: dict[str, list[float]] = {name: [] for name in ROLES}
            losses = {}
            for name, w in workers.items():
                t0 = time.perf_counter()
                losses[name] = w.ask(steps=warmup)["losses"]
                warmup_wall[name].append(time.perf_counter() - t0)
            for r in range(steps):
                order = ROLES[r % 3 :] + ROLES[: r % 3]
                for name in order if r % 2 else order[::-1]:
                    got = workers[name].ask(steps=1)
                    mine[name] += got["times"]
                    losses[name] += got["losses"]
            final = {name: w.ask(finish=True) for name, w in workers.items()}
            identical &= all(losses[n] == losses["baseline"] and final[n] == final["baseline"] for n in ROLES)
            for name in ROLES:
                times[name] += mine[name]
            per_repeat.append(statistics.median(mine["baseline"]) / statistics.median(mine["new"]))
            if rep == repeats - 1 and parts:
                pair = {name: workers[name] for name in ("baseline", "new")}
                rounds: dict[str, list[dict]] = {name: [] for name in pair}
                for r in range(parts):
                    for name in sorted(pair, reverse=bool(r % 2)):
                        rounds[name].append(pair[name].ask(parts=1))
                parts_ms = {
                    name: {k: statistics.median(p[k] for p in got) for k in got[0]} for name, got in rounds.items()
                }
                ops = {name: w.ask(ops=True) for name, w in pair.items()}
            if rep == repeats - 1 and kernels:
                kernel_ms = {name: workers[name].ask(kernels=kernels) for name in ("baseline", "new")}
                for k in kernel_ms.values():
                    k["groups"] = kernel_groups(k)
                    k["self_ms"] = {key: ms for key, ms in k["self_ms"].items() if ms >= 0.01}  # the record's size
                    k["calls"] = {key: n for key, n in k["calls"].items() if key in k["self_ms"]}
        finally:
            for w in workers.values():
                w.close()
    step_s = {name: statistics.median(ts) for name, ts in times.items()}
    model = cfg.model
    where = Path(config).resolve()
    return {
        "config": str(where.relative_to(ROOT)) if where.is_relative_to(ROOT) else str(config),
        "family": cfg.family,
        "d_model": model.d_model,
        "tokens_per_step": tokens,
        "step_seconds": step_s,
        "tokens_per_s": {name: tokens / s for name, s in step_s.items()},
        "ratio": step_s["baseline"] / step_s["new"],
        "control_ratio": step_s["baseline"] / step_s["control"],
        "ratio_per_repeat": per_repeat,
        "times": times,
        "warmup_wall_seconds": warmup_wall,
        "losses": losses,
        "identical": identical,
        "digests": final,
        "parts_ms": parts_ms,
        "ops": ops,
        "part_steps": parts,
        "kernels": kernel_ms,
        "kernel_steps": kernels,
        "setup": {
            "n_layers": model.n_layers,
            "n_heads": model.n_heads,
            "batch": cfg.train.batch_size,
            "seq": cfg.data_config.seq_len,
            "experts": model.ffn.num_experts,
            "widths": list(model.ffn.expert_widths),
            "topk": model.router.topk,
            "group_topk": model.router.group_topk,
            "gate_mode": model.router.gate_mode,
            "log_every": cfg.train.log_every,
        },
    }


def _git(tree: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def tree_version(tree: Path) -> dict:
    commit = _git(tree, "rev-parse", "HEAD")
    status = _git(tree, "status", "--porcelain", "--", "src", "kernels") if commit else None
    return {"commit": commit, "clean": None if status is None else status == ""}


@contextlib.contextmanager
def checkout_of(rev: str) -> Iterator[Path]:
    """``src/`` and ``kernels/`` of commit ``rev`` of this repository, in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="mohge-baseline-") as tmp:
        blob = subprocess.run(
            ["git", "archive", "--format=tar", rev, "src", "kernels"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        archive = Path(tmp) / "tree.tar"
        archive.write_bytes(blob)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        archive.unlink()
        yield Path(tmp)


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict:
    """The CPU and its vector unit as ATen sees it, the load, and the versions."""
    model = cpu_name()
    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    return {
        "cpu": model,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "matrix_units": sorted(f for f in flags if f.startswith("amx") or f in ("avx512_bf16", "avx512f", "avx2")),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def parse_sets(sets: Sequence[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs (a dotted key of the run config, a YAML value) as a dict; a malformed one is a ValueError
    naming it."""
    import yaml

    out: dict[str, object] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key or any(not part for part in key.split(".")):
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. train.fused=true")
        out[key] = yaml.safe_load(value)
    return out


def with_sets(config: Path, sets: dict[str, object], folder: Path) -> Path:
    """A copy of the run config ``config`` in ``folder`` with the dotted keys of ``sets`` set, checked as a run config
    (an unknown key or a bad value is a ConfigError naming it)."""
    from mohge.config import load_run_config

    raw = json.loads(Path(config).read_text())
    for key, value in sets.items():
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part} is not a section of {config}")
        node[leaf] = value
    out = folder / f"{len(list(folder.iterdir()))}-{Path(config).name}"
    out.write_text(json.dumps(raw, indent=1))
    load_run_config(out)
    return out


def run(
    base: Path,
    base_version: dict,
    configs: Sequence[Path],
    steps: int,
    warmup: int,
    parts: int,
    repeats: int,
    sets: dict[str, object] | None = None,
    new_configs: Sequence[Path | None] | None = None,
    kernels: int = 0,
) -> dict:
    """Every run config measured (:func:`measure_config`); this checkout's process trains ``new_configs`` where given
    (each config with ``sets`` applied: :func:`with_sets`)."""
    load0 = list(os.getloadavg())
    rows = []
    for config, new_config in zip(configs, new_configs or [None] * len(configs), strict=True):
        rows.append(_measured(base, config, steps, warmup, parts, repeats, new_config, kernels))
    return {
        "bench": "step",
        "host": host(),
        "clock": "thread_time",
        "threads": 1,
        "loadavg": {"start": load0, "end": list(os.getloadavg())},
        "baseline": base_version,
        "new": tree_version(ROOT),
        "new_sets": sets or {},
        "timed_steps": steps,
        "repeats": repeats,
        "warmup_steps": warmup,
        "runs": rows,
        "identical": all(r["identical"] for r in rows),
    }


def _measured(
    base: Path, config: Path, steps: int, warmup: int, parts: int, repeats: int, new_config: Path | None, kernels: int
) -> dict:
    row = measure_config(base, ROOT, config, steps, warmup, parts, repeats, new_config, kernels)
    tps = row["tokens_per_s"]
    print(
        f"  {row['family']:<9} d_model {row['d_model']:>3}: baseline {tps['baseline']:8.0f} tok/s, "
        f"new {tps['new']:8.0f} tok/s: {row['ratio']:.2f}x (each repeat "
        + ", ".join(f"{r:.2f}" for r in row["ratio_per_repeat"])
        + f"; baseline / control {row['control_ratio']:.2f}; identical: {row['identical']})"
    )
    for name, k in row["kernels"].items():
        print(
            f"    {name:<8} profiled: {k['step_ms']:6.1f} ms a step: "
            + ", ".join(f"{group} {ms:.1f}" for group, ms in k["groups"].items())
        )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench step", description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--baseline", help="a commit of this repository: its src/ and kernels/ are the baseline")
    where.add_argument("--baseline-tree", help="a folder holding the baseline's src/ and kernels/")
    ap.add_argument("--config", action="append", help="a run config (repeatable; default: the capacity study's)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per process and repeat, taken in turn")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per run config, their steps pooled")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps per process")
    ap.add_argument(
        "--parts",
        type=int,
        default=7,
        help="steps of the per-part profile after the timed ones (0: none; on the fused path its compiled graphs and "
        "native kernels are in no part: --kernels names them)",
    )
    ap.add_argument(
        "--kernels",
        type=int,
        default=0,
        help="steps profiled by torch's profiler after the timed ones, compiled kernels by name (0: none)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a knob of the run config set for this checkout's process only (repeatable), e.g. train.fused=true: "
        "the baseline and the control train the config as it is",
    )
    ap.add_argument("--json", help="also write the record here")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup < 0 or args.parts < 0 or args.kernels < 0:
        ap.error("--steps and --repeats must be at least 1, --warmup, --parts and --kernels at least 0")
    configs = [Path(c) for c in (args.config or [ROOT / c for c in DEFAULT_CONFIGS])]
    with contextlib.ExitStack() as stack:
        try:
            sets = parse_sets(args.set)
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mohge-bench-step-")))
            new_configs = [with_sets(c, sets, tmp) if sets else None for c in configs]  # refused before any process
        except (ValueError, OSError) as e:
            ap.error(str(e))
        if args.baseline:
            base = stack.enter_context(checkout_of(args.baseline))
            version = {"commit": _git(ROOT, "rev-parse", args.baseline), "clean": True}
        else:
            base = Path(args.baseline_tree).resolve()
            version = tree_version(base)
        print(f"step benchmark: baseline {version['commit']} against this checkout, {len(configs)} run config(s)")
        rec = run(
            base, version, configs, args.steps, args.warmup, args.parts, args.repeats, sets, new_configs, args.kernels
        )
    if args.json:
        write_json_atomic(args.json, rec)
    return 0
