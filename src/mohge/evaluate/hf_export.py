"""Export a trained mohge model as a Hugging Face ``transformers`` model folder.

    mohge export --ckpt results/<run>/model --out results/<run>/hf

The folder loads with ``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`` and
``AutoTokenizer.from_pretrained(out)``, and lm-eval's own ``hf`` model uses it as it is::

    lm_eval --model hf --model_args pretrained=OUT,trust_remote_code=True --device cpu ...

It holds ``config.json`` (``MoHGEConfig``, ``auto_map`` for AutoConfig and AutoModelForCausalLM),
``model.safetensors`` (fp32, mohge's parameter names under ``model.``, the output head as ``lm_head``),
``configuration_mohge.py`` and ``modeling_mohge.py`` (copied by ``save_pretrained`` from this package; they import
torch and transformers only, so the folder needs no mohge installed), ``generation_config.json``, the tokenizer
(``tokenizer.json`` as a ``PreTrainedTokenizerFast``: the end-of-text token ``data.eot_token`` (default
``<|endoftext|>``) is bos, eos and pad; no token is added around a text, and a literal "<|endoftext|>" inside a
text stays text, as in ``mohge.data.tokenizer``) and ``mohge_run_config.json``, the run config the model was trained
with. The end-of-text id (``bos/eos/pad_token_id`` of ``config.json`` and ``generation_config.json``) is the one
the tokenizer gives ``data.eot_token``, as in the training data (meta.json's ``eot_id``): 0 for our BPE.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mohge.config import ModelConfig, RunConfig
from mohge.core.atomic import share
from mohge.core.cli import setup_logging, user_errors
from mohge.core.knobs import ConfigError
from mohge.data.tokenizer import eot_id, load_tokenizer
from mohge.train.checkpoint import load_trained, trained_tokenizer

from .configuration_mohge import MoHGEConfig
from .modeling_mohge import MoHGEForCausalLM

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger("mohge.evaluate.hf_export")


def context_length(cfg: RunConfig) -> int:
    """Tokens per sequence the model was trained on (what every evaluation takes as ``max_length``)."""
    return min(cfg.data_config.seq_len, cfg.model.max_seq_len)


def hf_config(m: ModelConfig, max_length: int, eot_id: int) -> MoHGEConfig:
    """The ``MoHGEConfig`` of a model section; ``max_length`` is the context length it was trained at, ``eot_id``
    the tokenizer's end-of-text id (bos = eos = pad, what generation stops at)."""
    ffn, r = m.ffn, m.router
    return MoHGEConfig(
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        vocab_size=m.vocab_size,
        hidden_size=m.d_model,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        max_position_embeddings=max_length,
        rms_norm_eps=m.norm_eps,
        rope_base=m.rope_base,
        initializer_range=m.init_std,
        tie_embeddings=m.tie_embeddings,
        attention=m.attention,
        mla_q_head_dim=m.mla_q_head_dim,
        mla_rope_head_dim=m.mla_rope_head_dim,
        mla_v_head_dim=m.mla_v_head_dim,
        mla_kv_lora_rank=m.mla_kv_lora_rank,
        ffn_kind=ffn.kind,
        dense_layers=ffn.dense_layers,
        dense_width=ffn.dense_width,
        num_experts=ffn.num_experts,
        expert_widths=list(ffn.expert_widths),
        shared_expert_width=ffn.shared_expert_width,
        topk=r.topk,
        group_topk=r.group_topk,
        group_score=r.group_score,
        gate_mode=r.gate_mode,
        flat_gate=r.flat_gate,
        expert_bias=r.expert_bias_rate > 0,
        group_bias=r.group_bias_rate > 0,
    )


def hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mohge parameter names -> the HF model's: ``head.*`` -> ``lm_head.*``, everything else under ``model.``."""
    return {("lm_head." + k[5:] if k.startswith("head.") else "model." + k): v for k, v in state.items()}


def to_hf_model(model: torch.nn.Module, max_length: int, *, eot_id: int) -> MoHGEForCausalLM:
    """The HF model of a mohge ``LanguageModel``, sharing its parameter tensors (no copy), in eval mode;
    ``eot_id`` is its tokenizer's end-of-text id."""
    hf = MoHGEForCausalLM(hf_config(model.cfg, max_length, eot_id))
    persistent = model.state_dict().keys()  # buffers that are state (a router's selection bias), not rope tables
    state = {**dict(model.named_parameters()), **{k: b for k, b in model.named_buffers() if k in persistent}}
    missing, unexpected = hf.load_state_dict(hf_state_dict(state), strict=False, assign=True)
    if missing or unexpected:
        raise AssertionError(f"HF model and mohge model differ: missing {missing}, unexpected {unexpected}")
    return hf.to(next(model.parameters()).device).eval()


def hf_tokenizer(tokenizer_json: str | Path, max_length: int, eot_token: str) -> PreTrainedTokenizerFast:
    """The run's tokenizer as a ``PreTrainedTokenizerFast`` (bos = eos = pad = ``eot_token``, data.eot_token)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json),
        bos_token=eot_token,
        eos_token=eot_token,
        pad_token=eot_token,
        model_max_length=max_length,
        split_special_tokens=True,  # "<|endoftext|>" inside a text is text (mohge.data.tokenizer's encode)
        clean_up_tokenization_spaces=False,  # decode(encode(s)) == s
    )


def _is_export(path: Path) -> bool:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == "mohge"
    except (OSError, ValueError, AttributeError):
        return False


def export(ckpt: str | Path, out: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Write the HF folder of the trained model in ``ckpt`` to ``out`` (atomically: a temporary sibling folder,
    renamed into place; an earlier export at ``out`` is replaced, any other non-empty folder is refused)."""
    ckpt, out = Path(ckpt), Path(out)
    tok_path = trained_tokenizer(ckpt, tokenizer)  # parses, round-trips, is the model's own
    if out.exists() and any(out.iterdir()) and not _is_export(out):
        raise ConfigError(f"--out={out}: a non-empty folder that is not an earlier export; refusing to replace it")
    cfg, model = load_trained(ckpt, "cpu")
    eot_token = cfg.data_config.eot_token
    eot = eot_id(load_tokenizer(tok_path), eot_token, tok_path)  # the id the training data ended documents with
    hf = to_hf_model(model, context_length(cfg), eot_id=eot)
    MoHGEConfig.register_for_auto_class()
    MoHGEForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    hf.save_pretrained(tmp, safe_serialization=True)
    hf_tokenizer(tok_path, context_length(cfg), eot_token).save_pretrained(tmp)
    (tmp / "mohge_run_config.json").write_text((ckpt / "config.json").read_text())
    for f in tmp.iterdir():  # save_pretrained writes model.safetensors through a 0600 temporary file
        if f.is_file():
            share(f)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    log.info("exported %s -> %s", ckpt, out)
    return out


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge export",
        description="Export a trained model folder as a Hugging Face transformers model "
        "(load with trust_remote_code=True; lm_eval --model hf works on it).",
    )
    ap.add_argument("--ckpt", required=True, help="trained model folder (model.safetensors, config.json, tokenizer)")
    ap.add_argument("--out", required=True, help="folder to write (an earlier export there is replaced)")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: the one in --ckpt)")
    args = ap.parse_args(argv)
    setup_logging()
    print(export(args.ckpt, args.out, args.tokenizer))
    return 0
