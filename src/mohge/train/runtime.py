"""Where training runs: device, precision and processes (one per GPU under torchrun), checked against what the
run asked for (``--gpus``) before anything is built.

``setup_runtime`` picks the device (``train.device``; ``auto``: CUDA when visible and ``--gpus`` is not 0), starts
the process group under torchrun (nccl on CUDA, gloo on CPU) and chooses the autocast dtype (``train.precision``;
``auto``: bf16 on CUDA, fp32 on a CPU). ``wrap_ddp`` wraps the model for data parallelism.

A lost peer. The process group waits ``train.parallel.timeout_s`` (default 600 s) for the other ranks, and on
CUDA is bound to this rank's device (``device_id``: NCCL's communicator is created at once, on that GPU).
A collective that fails raises in every surviving rank: at once when the peer's process is gone (gloo: the
connection is reset), after the timeout when it stalls. :func:`peer_failure` recognises it; ``mohge.train``
then ends the rank with one line and ``EXIT_PEER`` (6), without the teardown that would wait on the lost peer.
On NCCL a collective that never completes is ended by PyTorch's watchdog after the same timeout (it aborts the
process; torchrun names the rank), and torchrun ends the ranks of a node whose worker died.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from mohge.config import ParallelConfig, TrainConfig

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

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def set_deterministic(mode: bool) -> None:
    """``torch.use_deterministic_algorithms`` without its import of the inductor config (~3 s at start-up,
    only to set a torch.compile flag; nothing here is compiled)."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(mode)
    else:
        setter(mode)


def setup_runtime(tc: TrainConfig, gpus: int | None = None) -> Runtime:
    """Device and process group; under torchrun (WORLD_SIZE > 1) one process per GPU, checked against what
    is visible and against ``gpus`` when given."""
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
    precision = tc.precision if tc.precision != "auto" else ("bf16" if kind == "cuda" else "fp32")
    if precision == "bf16" and kind == "cpu" and rank == 0:
        log.warning("bf16 autocast on a CPU is ~20x slower than fp32 here")
    return Runtime(rank, world, device, torch.bfloat16 if precision == "bf16" else None)


def wrap_ddp(model: torch.nn.Module, rt: Runtime) -> torch.nn.Module:
    """DDP without per-forward buffer broadcasts (the buffers are constants: RoPE tables, expert widths)."""
    ddp = torch.nn.parallel.DistributedDataParallel
    quiet = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    )
    ids = [rt.device.index] if rt.device.type == "cuda" else None
    return ddp(model, device_ids=ids, **{quiet: False})
