"""Activation memory of a training micro-batch: the bytes the forward saves for the backward, per token, counted
tensor by tensor from what this model's modules save (and checked against a measurement with saved-tensor
hooks: tests/unit/test_memory_model.py, within 10%), plus what expert parallelism keeps beside them.

Precision as the GPU trains: bf16 compute (b = 2 bytes: autocast, FSDP2's bf16 parameters) on an fp32 residual
stream. Counted per token (storages: a saved view keeps its whole storage alive), per layer:

* RMSNorm of width n: its fp32 input, the normalized fp32 tensor and the fp32 rstd: 8n + 4;
* a linear layer: its bf16 input, b n (each linear casts its own copy of an fp32 input);
* MHA (d_h = D / H): the qkv output b 3D (kept by v, a view of it), the rotated q and k b 2D, the attention
  output b D and its fp32 log-sum-exp 4H (flash / memory-efficient attention), plus the inputs of qkv and out;
* MLA: the inputs of q_proj, kv_down (b D each), kv_up (b r) and out (b H d_v), kv_norm over the rank r, the
  kv_up output b H (d_n + d_v) (kept by v), q and k (b H d_qk each), the attention output b H d_v, 4H;
* a SwiGLU of width F (dense FFN, shared expert): b (D + 4F): input, the [a; u] projection, SiLU(a), SiLU(a) u;
* the router: mohge's grouped router b 2D (two linears) + 8 (K + K_g) + b (2G + K_g + 2 + 2E + K) + E + 4G
  (the group aux loss); the top-k router b D + 8K + b K + 4E;
* the routed experts, per routed slot (K per token): torch path: the sorted rows and their outputs b 2D, two
  int64 indices 16, the gate b, the pre-activation [a; u] b 2h; Triton path: rows and outputs b 2D, [a; u]
  and SiLU(a) u b 3h, the order and its inverse 16; h the mean routed width (uniform routing);
* with expert parallelism (torch experts on the received rows): per slot also the returned rows kept by the
  combine b D and the dispatch and combine indices 16 (the all_to_all buffers that outlive the forward);
* the head: its bf16 input b D and the loss's fp32 log-softmax 4V; the token ids 8.

Besides, per MoE layer an EP rank keeps its experts' weights stacked in bf16 for the backward
(:func:`ep_weight_copies`): b x its local expert parameters. With ``block`` recompute each block keeps only its
fp32 input (4D) and one block's activations exist at a time.
"""

from __future__ import annotations

from mohge.config import ModelConfig, RunConfig
from mohge.config.sizes import attention_dims, total_params

B = 2  # bytes of the bf16 compute dtype


def _norm(n: int) -> float:
    return 8.0 * n + 4


def _swiglu(D: int, F: int) -> float:
    return B * (D + 4.0 * F)


def attention_bytes(cfg: ModelConfig) -> float:
    """Per token, one attention sub-block with its norm."""
    D, H = cfg.d_model, cfg.n_heads
    if cfg.attention == "mla":
        d_qk, d_v = attention_dims(cfg)
        r, d_n = cfg.mla_kv_lora_rank, cfg.mla_q_head_dim
        linear_in = B * (2 * D + r + H * d_v)
        kept = B * (H * (d_n + d_v) + 2 * H * d_qk + H * d_v) + 4 * H
        return _norm(D) + linear_in + _norm(r) + kept
    return _norm(D) + B * 8.0 * D + 4 * H


def moe_bytes(cfg: ModelConfig, backend: str = "torch", ep: bool = False) -> float:
    """Per token, one MoE sub-block (router, routed experts, shared expert) with its norm."""
    D, ffn, rc = cfg.d_model, cfg.ffn, cfg.router
    K, E, G = rc.topk, ffn.num_experts, ffn.num_groups
    if ffn.kind == "mohge":
        Kg = rc.group_topk
        router = B * 2 * D + 8 * (K + Kg) + B * (2 * G + Kg + 2 + 2 * E + K) + E + 4 * G
    else:
        router = B * D + 8 * K + B * K + 4 * E
    h = sum(ffn.per_expert_widths) / E
    if backend == "triton":
        slot = B * (2 * D + 3 * h) + 16
    else:
        slot = B * (2 * D + 1 + 2 * h) + 16
    if ep:
        slot += B * D + 16
    shared = _swiglu(D, ffn.shared_expert_width) if ffn.shared_expert_width else 0.0
    return _norm(D) + router + K * slot + shared


def activation_bytes_per_token(
    cfg: ModelConfig, backend: str = "torch", ep: bool = False, block_recompute: bool = False
) -> float:
    """Bytes saved for the backward per token of a micro-batch (module docstring); ``backend`` ``triton`` or
    ``torch`` (``auto``: triton, as on a GPU), ``ep``: the experts behind expert parallelism."""
    backend = "triton" if backend in ("auto", "triton") else "torch"
    first_moe = cfg.n_layers - cfg.moe_layers
    layers = [
        attention_bytes(cfg)
        + (
            moe_bytes(cfg, backend, ep)
            if i >= first_moe
            else _norm(cfg.d_model) + _swiglu(cfg.d_model, cfg.ffn.dense_width)
        )
        for i in range(cfg.n_layers)
    ]
    body = cfg.n_layers * 4.0 * cfg.d_model + max(layers) if block_recompute else sum(layers)
    head = _norm(cfg.d_model) + B * cfg.d_model + 4.0 * cfg.vocab_size + 8 + 8  # final norm, head input, loss, ids
    return body + head


def ep_weight_copies(local_expert_params: int) -> float:
    """Bytes of the bf16 stacks of an EP rank's experts that the MoE layers keep for the backward, from the
    rank's expert parameters summed over all its MoE layers."""
    return B * float(local_expert_params)


def eval_host_bytes(cfg: RunConfig, on_cpu: bool) -> float:
    """Host memory of an evaluation or tracing job: the model is built in fp32 on the host and its loaded state dict
    held beside it (2 x 4 bytes per parameter), plus, when the job runs on the CPU, the activations of one evaluation
    batch in fp32 (twice the bf16 bytes of :func:`activation_bytes_per_token`; a forward under no_grad keeps one
    block's activations: the ``block_recompute`` rule), plus 2 GiB for the interpreter, torch and lm-eval."""
    weights = 2 * 4.0 * total_params(cfg.model)
    tokens = cfg.eval.batch_size * cfg.data_config.seq_len
    acts = 2 * tokens * activation_bytes_per_token(cfg.model, cfg.model.ffn.backend, block_recompute=True)
    return weights + (acts if on_cpu else 0.0) + 2 * 1024**3
