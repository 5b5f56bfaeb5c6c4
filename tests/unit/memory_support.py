"""Bytes saved for the backward per token, measured: a forward under bf16 autocast with saved-tensor hooks, plus
the tensors that custom autograd Functions keep on their context (found by walking the graph), each storage
counted once, parameters left out; the per-token figure is the slope between two batch sizes (weights' bf16
casts and other per-step constants cancel).

    python tests/unit/memory_support.py CONFIG.json [--ep]     (prints the figure; TRITON_INTERPRET=1 for triton)
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mohge.config import RunConfig
from mohge.model import LanguageModel


def saved_bytes(model: LanguageModel, tokens_BS: torch.Tensor, shapes: list | None = None) -> int:
    """Bytes saved for the backward of one forward; ``shapes`` (when given) gets (shape, dtype) of each storage."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def note(t: torch.Tensor) -> None:
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in seen:
            seen[key] = t.untyped_storage().nbytes()
            if shapes is not None:
                shapes.append((tuple(t.shape), t.dtype, seen[key]))

    def pack(t):
        note(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(tokens_BS[:, :-1])
            loss = F.cross_entropy(out.logits.float().flatten(0, 1), tokens_BS[:, 1:].flatten())
    todo, done = [loss.grad_fn], set()
    while todo:  # what custom Functions hold on ctx (e.g. the torch experts' pre-activations)
        fn = todo.pop()
        if fn is None or id(fn) in done:
            continue
        done.add(id(fn))
        for v in getattr(fn, "__dict__", {}).values():
            for t in v if isinstance(v, list | tuple) else [v]:
                if isinstance(t, torch.Tensor):
                    note(t)
        todo.extend(f for f, _ in fn.next_functions)
    return sum(seen.values())


def per_token(cfg: RunConfig, ep: bool = False) -> float:
    model = build(cfg, ep)
    S, V = cfg.data_config.seq_len, cfg.model.vocab_size
    g = torch.Generator().manual_seed(0)
    small, large = (saved_bytes(model, torch.randint(0, V, (b, S + 1), generator=g)) for b in (2, 6))
    return (large - small) / (4 * S)


def build(cfg: RunConfig, ep: bool = False) -> LanguageModel:
    torch.manual_seed(0)
    model = LanguageModel(cfg.model, cfg.loss)
    if ep:  # every expert behind the EP layer on a one-rank group: dispatch, all_to_all and combine all run
        from mohge.train.distributed.ep_layer import from_routed

        if not dist.is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group("gloo", rank=0, world_size=1)
        for layer in model.moe_layers():
            layer.experts = from_routed(layer.experts, [0] * cfg.model.ffn.num_experts, 0, dist.group.WORLD)
    return model


if __name__ == "__main__":
    cfg = RunConfig.from_dict(json.loads(open(sys.argv[1]).read()))
    print(json.dumps({"per_token": per_token(cfg, "--ep" in sys.argv)}))
