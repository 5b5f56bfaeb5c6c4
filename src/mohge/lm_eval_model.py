"""lm-eval adapter: a trained model folder as an ``lm_eval.api.model.LM`` registered under the name ``mohge``.

    from mohge.lm_eval_model import MoHGELM
    lm = MoHGELM("results/<run>/model", device="cpu", batch_size=16)   # or model="mohge" in lm-eval

The folder holds ``model.safetensors``, ``config.json`` and ``tokenizer.json`` (what ``mohge.train`` writes).
Text is encoded with our byte-level BPE, which has no BOS token: ``<|endoftext|>`` (EOT_ID), which ends every
training document, is put before every context and before each document's first rolling window.

* ``loglikelihood``: context and continuation are encoded apart (trailing spaces of the context move to the
  continuation, as in lm-eval's HF model, so " word" stays one pre-token); the last ``max_length`` + 1 tokens
  are kept; requests are sorted by length and scored ``batch_size`` at a time (right padding is harmless:
  attention is causal and routing is per token).
* ``loglikelihood_rolling``: disjoint windows of ``max_length`` tokens (lm-eval's ``get_rolling_token_windows``
  with context_len 1), each token predicted exactly once; windows of all documents are batched together.
* ``generate_until``: greedy decoding, one request at a time (the model has no KV cache, so each new token
  re-reads the last ``max_length`` tokens); stops at EOT, at ``max_gen_toks`` or when a string of ``until``
  appears, and cuts the text before it.

``max_length`` is the sequence length the model was trained at (``data.seq_len``), not ``max_seq_len``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from .checkpoint import load_trained
from .tokenizer import EOT_ID, decode, encode, load_tokenizer

log = logging.getLogger("mohge.lm_eval_model")


@register_model("mohge")
class MoHGELM(LM):
    def __init__(
        self,
        pretrained: str,
        device: str = "auto",
        batch_size: int | str = 16,
        max_gen_toks: int = 256,
        tokenizer: str | None = None,
        precision: str = "auto",
        **_ignored: Any,
    ) -> None:
        super().__init__()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(device)
        self.cfg, self.model = load_trained(pretrained, self._device)
        tok_path = Path(tokenizer) if tokenizer else Path(pretrained) / "tokenizer.json"
        if not tok_path.is_file():
            raise FileNotFoundError(f"{tok_path} is missing: pass tokenizer=PATH (the data folder's tokenizer.json)")
        self.tok = load_tokenizer(tok_path)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16  # lm-eval's "auto" -> 16
        self.max_gen_toks = int(max_gen_toks)
        self.max_length = min(self.cfg.data_config.seq_len, self.cfg.model.max_seq_len)
        bf16 = precision == "bf16" or (precision == "auto" and self._device.type == "cuda")
        self.autocast = torch.bfloat16 if bf16 else None

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def eot_token_id(self) -> int:
        return EOT_ID

    def tok_encode(self, text: str) -> list[int]:
        return encode(self.tok, text)

    def tok_decode(self, ids: Sequence[int]) -> str:
        return decode(self.tok, ids)

    # ------------------------------------------------------------------------------------------------
    # scoring
    # ------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def _logits(self, rows: list[list[int]]) -> torch.Tensor:
        """Logits [B, S, V] (float32) of right-padded rows."""
        S = max(len(r) for r in rows)
        x = torch.full((len(rows), S), EOT_ID, dtype=torch.long)
        for i, r in enumerate(rows):
            x[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        with torch.autocast(self._device.type, dtype=self.autocast, enabled=self.autocast is not None):
            return self.model(x.to(self._device)).logits.float()

    def _score(self, pairs: list[tuple[list[int], list[int]]], desc: str, quiet: bool) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), is greedy) of token pairs, batched by length."""
        L = self.max_length
        prepared = []
        for ctx, cont in pairs:
            cont = cont[-L:]
            full = (ctx + cont)[-(L + 1) :]
            prepared.append((full[:-1], full[len(full) - len(cont) :]))
        order = sorted(range(len(pairs)), key=lambda i: -len(prepared[i][0]))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        for b in tqdm(range(0, len(order), self.batch_size), desc=desc, disable=quiet or None):
            idx = [i for i in order[b : b + self.batch_size] if prepared[i][1]]
            if not idx:
                continue
            logits = self._logits([prepared[i][0] for i in idx])
            for row, i in enumerate(idx):
                inp, cont = prepared[i]
                logp = torch.log_softmax(logits[row, len(inp) - len(cont) : len(inp)], dim=-1)
                target = torch.tensor(cont, device=logp.device)
                ll = logp.gather(1, target[:, None]).sum().item()
                results[i] = (ll, bool((logp.argmax(-1) == target).all()))
        return results

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = []
        for req in requests:
            context, continuation = req.args
            n_spaces = len(context) - len(context.rstrip(" "))
            if n_spaces:
                context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
            pairs.append(([EOT_ID, *self.tok_encode(context)], self.tok_encode(continuation)))
        results = self._score(pairs, "loglikelihood", disable_tqdm)
        for req, res in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs, owner = [], []
        for i, req in enumerate(requests):
            (text,) = req.args
            windows = get_rolling_token_windows(self.tok_encode(text), EOT_ID, self.max_length, 1)
            for w in map(make_disjoint_window, windows):
                pairs.append(w)
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self._score(pairs, "rolling", disable_tqdm), strict=True):
            totals[i] += ll
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        outputs = []
        for req in tqdm(requests, desc="generate", disable=disable_tqdm or None):
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            if kwargs.get("do_sample") or kwargs.get("temperature", 0.0):
                log.warning("generate_until is greedy; ignoring sampling arguments %s", kwargs)
            ids, new = [EOT_ID, *self.tok_encode(context)], []
            text = ""
            for _ in range(max_new):
                nxt = int(self._logits([(ids + new)[-self.max_length :]])[0, -1].argmax())
                if nxt == EOT_ID:
                    break
                new.append(nxt)
                text = self.tok_decode(new)
                if any(u in text for u in until):
                    break
            for u in until:
                text = text.split(u, 1)[0]
            outputs.append(text)
            self.cache_hook.add_partial("generate_until", req.args, text)
        return outputs
