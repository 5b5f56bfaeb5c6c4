"""Where training runs: device, precision and processes (one per GPU under torchrun), checked against what the
run asked for (``--gpus``) before anything is built.

``setup_runtime`` picks the device (``train.device``; ``auto``: CUDA when visible and ``--gpus`` is not 0), starts
the process group under torchrun (nccl on CUDA, gloo on CPU) and chooses the autocast dtype (``train.precision``;
``auto``: bf16 on CUDA, fp32 on a CPU). On a CPU it also detects and measures the CPU's bf16 support
(:func:`mohge.kernels.cpu_gemm.cpu_bf16_support`: ISA flags, a short fp32 vs bf16 GEMM), which every run's
summary records. ``wrap_ddp`` wraps the model for data parallelism.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import TrainConfig

log = logging.getLogger("mohge.train")


class LaunchError(RuntimeError):
    """The processes or devices do not match what the run asked for."""


@dataclass
class Runtime:
    rank: int
    world: int
    device: torch.device
    autocast: torch.dtype | None
    cpu_bf16: dict | None = None  # the CPU's detected and measured bf16 support (None on CUDA)

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
        dist.init_process_group("nccl" if kind == "cuda" else "gloo")  # env:// from torchrun
    precision = tc.precision if tc.precision != "auto" else ("bf16" if kind == "cuda" else "fp32")
    cpu_bf16 = None
    if kind == "cpu":
        from .kernels.cpu_gemm import cpu_bf16_support

        cpu_bf16 = cpu_bf16_support()
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
    return Runtime(rank, world, device, torch.bfloat16 if precision == "bf16" else None, cpu_bf16)


def wrap_ddp(model: torch.nn.Module, rt: Runtime) -> torch.nn.Module:
    """DDP without per-forward buffer broadcasts (the buffers are constants: RoPE tables, expert widths)."""
    ddp = torch.nn.parallel.DistributedDataParallel
    quiet = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    )
    ids = [rt.device.index] if rt.device.type == "cuda" else None
    return ddp(model, device_ids=ids, **{quiet: False})
