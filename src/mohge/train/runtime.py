"""Where training runs: device, precision and processes (one per GPU under torchrun), checked against what the
run asked for (``--gpus``) before anything is built.

``setup_runtime`` picks the device (``train.device``; ``auto``: CUDA when visible and ``--gpus`` is not 0), starts
the process group under torchrun (nccl on CUDA, gloo on CPU) and chooses the autocast dtype (``train.precision``;
``auto``: :func:`auto_precision`, bf16 on CUDA; on a CPU bf16 only where it has bf16 units and the model is wide
enough for bf16 to pay, else fp32). On a CPU it also detects and measures the CPU's bf16 support
(:func:`mohge.kernels.cpu_gemm.cpu_bf16_support`: ISA flags, a short fp32 vs bf16 GEMM), which every run's
summary records with the precision and the reason ``auto`` gave for it. ``wrap_ddp`` wraps the model for data
parallelism.

A lost peer. The process group waits ``train.parallel.timeout_s`` (default 600 s) for the other ranks, and on
CUDA is bound to this rank's device (``device_id``: NCCL's communicator is created at once, on that GPU).
A collective that fails raises in every surviving rank: at once when the peer's process is gone (gloo: the
connection is reset), after the timeout when it stalls. :func:`peer_failure` recognises it; ``mohge.train``
then ends the rank with one line and ``EXIT_PEER`` (6), without the teardown that would wait on the lost peer.
On NCCL a collective that never completes is ended by PyTorch's watchdog after the same timeout (it aborts the
process; torchrun names the rank), and torchrun ends the ranks of a node whose worker died.

Stopping on a signal (:class:`GracefulStop`): SIGTERM (what SLURM sends before a time limit or on preemption,
``--signal`` in workflow/profiles/slurm) and SIGINT (Ctrl-C) during the step loop only ask the loop to stop; it
finishes the step it is in, every rank agrees on the step (one all-reduce of the flag per step), writes a
checkpoint of that step and raises :class:`Stopped`, which the command reports in one line with exit status
128 + the signal's number (143, 130; docs/errors.md). A second SIGINT, or a signal outside the loop, stops at
once: :class:`mohge.core.cli.Interrupted`, also one line and the same status, the checkpoints written so far kept. A
second SIGTERM in the loop is ignored: under SLURM every process of the job gets one and torchrun forwards its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import inspect
import logging
import os
import platform
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mohge.config import ParallelConfig, TrainConfig
from mohge.core.cli import Interrupted

log = logging.getLogger("mohge.train")


class LaunchError(RuntimeError):
    """The processes or devices do not match what the run asked for."""


class PeerLostError(RuntimeError):
    """A collective failed: another rank died or stalled past the process group's timeout."""


# What gloo's errors say when the other end of a collective is gone or silent (they are plain RuntimeErrors).
_GLOO_PEER = ("Connection reset by peer", "Connection closed by peer", "Timed out waiting", "Broken pipe")


def peer_failure(err: BaseException) -> bool:
    """Whether ``err`` is a failed collective (a lost or stalled peer) rather than a bug of this rank."""
    if isinstance(err, dist.DistError):  # NCCL's DistBackendError, the store's DistNetworkError / DistStoreError
        return True
    return isinstance(err, RuntimeError) and any(m in str(err) for m in _GLOO_PEER)


def init_process_group(kind: str, device: torch.device, timeout_s: float) -> None:
    """The default process group from torchrun's env:// (nccl on CUDA, bound to ``device``; gloo on a CPU)."""
    extra = {"device_id": device} if kind == "cuda" else {}
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo", timeout=timeout, **extra)


@dataclass
class Runtime:
    rank: int
    world: int
    device: torch.device
    autocast: torch.dtype | None
    cpu_bf16: dict | None = None  # the CPU's detected and measured bf16 support (None on CUDA)
    precision_reason: str = "set by train.precision"

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def set_deterministic(mode: bool) -> None:
    """``torch.use_deterministic_algorithms`` without its import of the inductor config (~3 s at start-up,
    only to set a torch.compile flag; nothing here is compiled), and without its filling of uninitialized memory.

    With deterministic algorithms on, torch by default fills every tensor made by ``empty`` (and every output an op
    allocates so) with NaN before the op writes it, so that a kernel that reads memory it never wrote still gives one
    result. Every tensor here is written before it is read (a read of the fill would surface as NaN), so the fill only
    costs time: at d_model 32 and 64 about 10 % of a training step, most of it on the expert path's [T*K, D] buffers.
    The algorithms stay deterministic; the numbers do not change (``mohge bench step`` compares them bit for bit)."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(mode)
    else:
        setter(mode)
    fill = getattr(torch._C, "_set_deterministic_fill_uninitialized_memory", None)
    if fill is not None:
        fill(False)


def exit_now(code: int) -> None:
    """End a rank of a multi-process run with ``code`` once its outputs are written and its process group destroyed,
    without the interpreter's teardown: there, torch's gloo threads can still be destroyed while joinable and abort a
    finished rank ("terminate called without an active exception", SIGABRT; upstream: pytorch/pytorch PR 179291).
    Logs and the standard streams are flushed first; nothing else of ours waits for the interpreter's exit."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest mmap threshold on a 64-bit system


def keep_freed_memory() -> bool:
    """Keep the memory a training step frees in the process for the next step (glibc's malloc; elsewhere a no-op).

    A CPU step allocates and frees the same large buffers every step (at d_model 32 on the facts source the logits,
    their log-softmax and their gradients are [10240, 514], 21 MB each). glibc hands blocks above its mmap threshold
    back to the kernel when they are freed and trims the top of its heap above its trim threshold, so the next step
    faults the same memory back in page by page: measured up to 20,000 minor faults and 50 ms of system time in a 300 ms
    step at d_model 32. Raising the mmap threshold to glibc's largest (32 MB) and the trim threshold out of reach keeps
    those pages; the peak memory is what it was. Nothing computed changes. Returns whether glibc took both settings."""
    if os.name != "posix" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
        )
    except (OSError, AttributeError):
        return False


# bf16 on a CPU pays only from this model width on, and only where this CPU's bf16 GEMMs are measurably faster
# (docs/benchmarks.md, one thread: on an AMD EPYC with avx512_bf16 a 256^3 bf16 GEMM runs 1.9x the fp32 speed and a
# whole training step at d_model 256 1.33x; on an Intel Xeon that lists the same flags the GEMM runs 0.5x and the step
# 0.65x; at the claims study's d_model 128 at most ~1.15x, at the smoke model's 32 0.4x, where casts outweigh GEMMs).
CPU_BF16_MIN_D_MODEL = 256
CPU_BF16_MIN_GEMM_SPEEDUP = 1.25  # fp32 / bf16 GEMM time: a step gains about two thirds of the GEMM's speed-up


def auto_precision(kind: str, d_model: int | None, cpu_bf16: dict | None) -> tuple[str, str]:
    """What ``train.precision: auto`` trains in, and why: bf16 on CUDA; on a CPU bf16 when it has bf16 units
    (``cpu_bf16["bf16_units"]``: avx512_bf16 or amx_bf16, and oneDNN's bf16), ``d_model`` is at least
    :data:`CPU_BF16_MIN_D_MODEL` and the GEMM probe measured here (``cpu_bf16["gemm_fp32_over_bf16_time"]``,
    :func:`mohge.kernels.cpu_gemm.cpu_bf16_support`) runs bf16 at least :data:`CPU_BF16_MIN_GEMM_SPEEDUP` times the
    fp32 speed; else fp32. CPU flags do not predict bf16 speed, so the choice rests on the measurement, and the reason
    (recorded in the run's summary beside the probe) names it."""
    if kind == "cuda":
        return "bf16", "auto: CUDA"
    if not (cpu_bf16 or {}).get("bf16_units"):
        return "fp32", "auto: this CPU has no bf16 units (avx512_bf16 / amx_bf16 with oneDNN bf16)"
    if d_model is None or d_model < CPU_BF16_MIN_D_MODEL:
        return "fp32", f"auto: d_model {d_model} < {CPU_BF16_MIN_D_MODEL}, where bf16 does not pay on a CPU"
    ratio = float(cpu_bf16.get("gemm_fp32_over_bf16_time", 0.0))
    shape = "x".join(str(v) for v in cpu_bf16.get("gemm_shape", ()))
    measured = f"a {shape} bf16 GEMM runs at {ratio:.2f}x the fp32 speed on this CPU (measured, one thread)"
    if ratio < CPU_BF16_MIN_GEMM_SPEEDUP:
        return "fp32", f"auto: {measured}, below the {CPU_BF16_MIN_GEMM_SPEEDUP}x where bf16 training pays"
    return "bf16", f"auto: bf16 units, d_model {d_model} >= {CPU_BF16_MIN_D_MODEL} and {measured}"


def setup_runtime(tc: TrainConfig, gpus: int | None = None, d_model: int | None = None) -> Runtime:
    """Device and process group; under torchrun (WORLD_SIZE > 1) one process per GPU, checked against what
    is visible and against ``gpus`` when given. ``d_model`` is the model's width, for ``precision: auto``."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", world))
    kind = tc.device if tc.device != "auto" else ("cuda" if torch.cuda.is_available() and gpus != 0 else "cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise LaunchError("train.device='cuda' but torch sees no CUDA device")
        visible = torch.cuda.device_count()
        if gpus is not None and (visible != gpus or local_world != gpus):
            raise LaunchError(
                f"--gpus {gpus}: {visible} GPU(s) visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}), {local_world} process(es) on this node"
            )
        if local_world > visible:
            raise LaunchError(f"{local_world} processes on this node but only {visible} GPU(s) visible")
        if local_world < visible and rank == 0:
            log.warning("using %d of the %d visible GPUs", local_world, visible)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        if gpus:
            raise LaunchError(f"--gpus {gpus} given but train.device resolves to cpu")
        device = torch.device("cpu")
    if world > 1:
        init_process_group(kind, device, (tc.parallel or ParallelConfig()).timeout_s)
    cpu_bf16 = None
    if kind == "cpu":
        keep_freed_memory()
        from mohge.kernels.cpu_gemm import cpu_bf16_support

        cpu_bf16 = cpu_bf16_support()
    precision, reason = (
        (tc.precision, "set by train.precision") if tc.precision != "auto" else auto_precision(kind, d_model, cpu_bf16)
    )
    if rank == 0 and tc.precision == "auto":
        log.info("train.precision auto: %s (%s)", precision, reason.removeprefix("auto: "))
    if kind == "cpu":
        if precision == "bf16" and rank == 0:
            ratio, units = cpu_bf16["gemm_fp32_over_bf16_time"], cpu_bf16["bf16_units"]
            say = log.info if units and ratio > 1 else log.warning
            say(
                "train.precision bf16 on a CPU %s bf16 units (avx512_bf16 %s, amx_bf16 %s): a %s GEMM runs "
                "%.2fx faster in bf16 than fp32 here (measured)",
                "with" if units else "WITHOUT",
                cpu_bf16.get("avx512_bf16"),
                cpu_bf16.get("amx_bf16"),
                "x".join(map(str, cpu_bf16["gemm_shape"])),
                ratio,
            )
    return Runtime(rank, world, device, torch.bfloat16 if precision == "bf16" else None, cpu_bf16, reason)


def wrap_ddp(model: torch.nn.Module, rt: Runtime) -> torch.nn.Module:
    """DDP without per-forward buffer broadcasts (the buffers are constants: RoPE tables, expert widths)."""
    ddp = torch.nn.parallel.DistributedDataParallel
    quiet = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    )
    ids = [rt.device.index] if rt.device.type == "cuda" else None
    return ddp(model, device_ids=ids, **{quiet: False})


# ---------------------------------------------------------------- stopping on SIGTERM / SIGINT

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The step loop stopped on a signal after checkpointing ``step`` (``path``); one line, 128 + signum."""

    def __init__(self, signum: int, step: int, path: object):
        self.signum, self.step, self.path = signum, step, path
        super().__init__(
            f"{signal.Signals(signum).name} received: stopped after step {step} with a checkpoint in {path}; "
            "the same command resumes from it"
        )


class GracefulStop:
    """While installed (:meth:`installed`), SIGTERM and SIGINT raise :class:`Interrupted` at once, except inside
    :meth:`in_loop`, where the first one only sets a flag that :meth:`requested` reports after the current step
    (a second SIGINT there stops at once, a second SIGTERM is ignored)."""

    def __init__(self) -> None:
        self.signum = 0
        self._loop = False

    def _handler(self, signum: int, frame: object) -> None:
        if self._loop and not self.signum:
            self.signum = signum
            log.warning(
                "%s received: finishing this step, then a checkpoint (Ctrl-C again stops at once)",
                signal.Signals(signum).name,
            )
            return
        if self._loop and signum == signal.SIGTERM:  # a repeat: torchrun forwards the one SLURM sent to all
            return
        raise Interrupted(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[GracefulStop]:
        if threading.current_thread() is not threading.main_thread():  # handlers belong to the main thread
            yield self
            return
        old = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def in_loop(self) -> Iterator[GracefulStop]:
        self._loop = True
        try:
            yield self
        finally:
            self._loop = False

    def requested(self, rt: Runtime) -> int:
        """The signal number when any rank got a stop signal (0: go on); a collective when world > 1."""
        if rt.world == 1:
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int64, device=rt.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())
