"""lm-eval adapter: a trained model folder as an lm-eval model registered under the name ``mohge``.

    mohge lm-eval --model mohge --model_args pretrained=results/<run>/model --tasks ...   (lm-eval's CLI)
    from mohge.evaluate.lm_eval_adapter import MoHGELM; lm = MoHGELM("results/<run>/model", device="cpu", batch_size=16)

The folder holds ``model.safetensors``, ``config.json`` and ``tokenizer.json`` (what ``mohge.train`` writes).
The model is mohge's own ``LanguageModel`` (any expert backend, Triton included); the exported Hugging Face model
(``mohge.evaluate.hf_export``) run by lm-eval's ``hf`` model gives the same scores, because both are ``TemplateLM``s:

* text becomes tokens as in lm-eval's HF model: a (context, continuation) pair is encoded whole and split at the
  context's length, trailing whitespace of the context moved to the continuation; no token is added before a
  context; an empty context is the end-of-text token (``data.eot_token``, default ``<|endoftext|>``: bos = eos =
  pad, which ends every training document; its id is the tokenizer's, looked up in the model folder's
  ``tokenizer.json``: 0 for our BPE, 50256 for GPT-2's);
* ``loglikelihood``: the last ``max_length`` + 1 tokens of context + continuation, the continuation scored. Every
  request's input joins one prefix tree (model_arg ``share_context``, default true), so that each distinct prefix
  runs once: the context the choices of a document share, the words choices start with, the opening of documents
  of one template. The tree is packed into rows of ``2 * max_length`` tokens (``tree_row_contexts``) in which each
  token sees its own prefix and sits at its depth (:mod:`mohge.evaluate.prefix_tree`; equal to running each request
  alone, to rounding: routing is per token). ``share_context=false`` runs every request whole instead,
  ``batch_size`` rows at a time, longest first, right-padded (harmless: attention is causal and routing is per
  token): the reference the tests and ``mohge bench eval`` compare it with. A continuation longer than
  ``max_length`` is refused (ValueError naming the task, the document and both lengths), where lm-eval's ``hf``
  model stops on a bare assert: scoring only its last tokens would be a different quantity. ``python -m
  mohge.evaluate build-tasks`` builds only documents that fit;
* ``loglikelihood_rolling``: disjoint windows of ``max_length`` tokens (lm-eval's ``get_rolling_token_windows``,
  context_len 1, EOT first), each token predicted once;
* ``generate_until``: greedy, ``batch_size`` requests at a time, left-padded, with a KV cache (the forward pass of
  the exported HF model, built in memory on the same weights); the context keeps its last ``max_length -
  max_gen_toks`` tokens; a row stops at EOT, after ``max_gen_toks`` tokens or when a string of ``until`` appears,
  and its text is cut before that string.

``max_length`` defaults to the context length the model was trained at (``data.seq_len``). ``dtype`` is accepted
as HFLM's name for ``precision`` (``float32``/``fp32``, ``bfloat16``/``bf16``, ``auto``). ``model_args`` other
than those of ``__init__`` are refused (ValueError naming the argument). A CUDA device asked for on a machine
without one (lm-eval's default is ``cuda:0``) falls back to the CPU with a warning, as lm-eval's HF model does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from mohge.core.knobs import ConfigError
from mohge.data.tokenizer import decode, encode, eot_id, load_tokenizer
from mohge.train.checkpoint import load_trained, trained_tokenizer

log = logging.getLogger("mohge.evaluate.lm_eval_adapter")

PRECISIONS = ("auto", "fp32", "bf16")
DTYPES = {"auto": "auto", "float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16"}  # HFLM's dtype=
# lm-eval passes these with every model (CLI --batch_size, --max_batch_size, --device; --trust_remote_code)
MODEL_ARGS = (
    "pretrained",
    "device",
    "batch_size",
    "max_batch_size",
    "max_gen_toks",
    "max_length",
    "tokenizer",
    "precision",
    "dtype",
    "trust_remote_code",
    "share_context",
)


def resolve_device(device: str | None) -> torch.device:
    """``auto`` (or none): CUDA when present, else the CPU; a CUDA device on a machine without CUDA: the CPU."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"model_args device={device!r}: not a torch device ({err})") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        log.warning("device=%s: CUDA is not available, running on the CPU", device)
        return torch.device("cpu")
    return dev


def _batch_size(batch_size: int | str, max_batch_size: int | None) -> int:
    """An int, or lm-eval's ``auto`` / ``auto:N`` (16 sequences, capped by ``max_batch_size``)."""
    if isinstance(batch_size, str) and batch_size.startswith("auto"):
        return min(16, int(max_batch_size)) if max_batch_size else 16
    try:
        value = int(batch_size)
    except ValueError as err:
        raise ConfigError(f"model_args batch_size={batch_size!r}: expected an integer or 'auto'") from err
    if value < 1:
        raise ConfigError(f"model_args batch_size={batch_size!r}: must be >= 1")
    return value


def _score(logits_NV: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
    """(sum of log p of the continuation's tokens, whether each is the argmax) from the logits predicting them."""
    logp = torch.log_softmax(logits_NV, dim=-1)
    target = torch.tensor(cont, device=logp.device)
    return float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())


@register_model("mohge")
class MoHGELM(TemplateLM):
    tree_row_contexts = 2  # a packed row of the prefix tree holds this many context lengths of tokens

    def __init__(
        self,
        pretrained: str,
        device: str = "auto",
        batch_size: int | str = 16,
        max_batch_size: int | None = None,
        max_gen_toks: int = 256,
        max_length: int | None = None,
        tokenizer: str | None = None,
        precision: str = "auto",
        dtype: str | None = None,  # HFLM's name for precision
        trust_remote_code: bool = False,  # accepted for lm-eval's --trust_remote_code; there is no remote code here
        share_context: bool | str = True,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigError(
                f"model_args {name}={unknown[name]!r}: unknown argument of the mohge model "
                f"(it takes {', '.join(MODEL_ARGS)})"
            )
        if dtype is not None:
            if str(dtype) not in DTYPES:
                raise ConfigError(f"model_args dtype={dtype!r}: must be one of {sorted(DTYPES)}")
            if precision != "auto" and precision != DTYPES[str(dtype)]:
                raise ConfigError(f"model_args dtype={dtype!r} and precision={precision!r} disagree: give one")
            precision = DTYPES[str(dtype)]
        if precision not in PRECISIONS:
            raise ConfigError(f"model_args precision={precision!r}: must be one of {PRECISIONS}")
        self._device = resolve_device(device)
        self.cfg, self.model = load_trained(pretrained, self._device)
        tok_path = trained_tokenizer(pretrained, tokenizer)  # parses, round-trips, is the model's own
        self.tok = load_tokenizer(tok_path)
        self.eot = eot_id(self.tok, self.cfg.data_config.eot_token, tok_path)  # = the data's meta["eot_id"]
        self.batch_size = _batch_size(batch_size, max_batch_size)
        self.max_gen_toks = int(max_gen_toks)
        trained = min(self.cfg.data_config.seq_len, self.cfg.model.max_seq_len)  # = hf_export.context_length
        self.max_length = trained if max_length is None else int(max_length)
        if not 1 <= self.max_length <= self.cfg.model.max_seq_len:
            raise ConfigError(
                f"model_args max_length={max_length!r}: must be in [1, {self.cfg.model.max_seq_len}] "
                f"(the model's max_seq_len; it was trained at {trained})"
            )
        bf16 = precision == "bf16" or (precision == "auto" and self._device.type == "cuda")
        self.autocast = torch.bfloat16 if bf16 else None
        self._hf = None  # the cached-generation model, built on first use
        # choices of one document score from one cached pass of their context (_loglikelihood_tokens); False scores
        # every request whole (lm-eval passes model_args as strings)
        self.share_context = str(share_context).lower() not in ("false", "0", "no")

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def eot_token_id(self) -> int:
        return self.eot

    @property
    def prefix_token_id(self) -> int:
        return self.eot

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return encode(self.tok, string)  # our tokenizer adds no special token, whatever add_special_tokens says

    def tok_decode(self, ids: Sequence[int]) -> str:
        return decode(self.tok, ids)

    def _autocast(self):
        return torch.autocast(self._device.type, dtype=self.autocast, enabled=self.autocast is not None)

    # ------------------------------------------------------------------------------------------------
    # scoring
    # ------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def _logits(self, rows: list[list[int]]) -> torch.Tensor:
        """Logits [B, S, V] (float32) of right-padded rows."""
        S = max(len(r) for r in rows)
        x = torch.full((len(rows), S), self.eot, dtype=torch.long)
        for i, r in enumerate(rows):
            x[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        with self._autocast():
            return self.model(x.to(self._device)).logits.float()

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """TemplateLM's, after refusing a continuation longer than the context (one line naming the task)."""
        for req in requests:
            context, continuation = req.args
            if context:
                n = len(self._encode_pair(context, continuation)[1])
            else:  # TemplateLM: an empty context is the end-of-text token, or the continuation's first token
                ids = self.tok_encode(continuation)
                n = len(ids) - (1 if ids and ids[0] == self.prefix_token_id else 0)
            if n > self.max_length:
                task, doc = getattr(req, "task_name", None), getattr(req, "doc_id", None)
                raise ConfigError(
                    f"task {task} doc {doc}: a continuation of {n} tokens is longer than the model's context of "
                    f"{self.max_length} tokens (max_length); build the tasks for this context (python -m "
                    "mohge.evaluate build-tasks --ckpt MODEL ...) or give a larger max_length"
                )
        return super().loglikelihood(requests, disable_tqdm)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), is greedy) per (cache key, context ids, continuation ids).

        With ``share_context`` every request's model input (the last ``max_length`` tokens of context and
        continuation but the last) joins one prefix tree: each distinct prefix (the context all choices of a
        document share, the first words choices share, the opening documents of one template share) runs once, in
        packed rows of ``tree_row_contexts * max_length`` tokens where each token sees its own prefix
        (:meth:`_score_tree`); a request scored from a one-token context runs whole (it shares nothing more).
        Without it every request runs whole, ``batch_size`` rows at a time, longest first.
        """
        L = self.max_length
        prepared = []
        for key, ctx, cont in requests:
            if len(cont) > L:
                raise ConfigError(f"{key!r}: a continuation of {len(cont)} tokens is longer than max_length={L}")
            full = (ctx + cont)[-(L + 1) :]
            prepared.append((full[:-1], cont))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(requests)
        scored = [i for i, (_, cont) in enumerate(prepared) if cont]
        # a request scored from a one-token context (the end-of-text token rolling-perplexity windows and empty
        # contexts start from) shares at most that token: it runs whole, where the tree's masks would cost more
        tree = [i for i in scored if self.share_context and len(prepared[i][0]) - len(prepared[i][1]) > 0]
        if tree:
            for i, res in zip(tree, self._score_tree([prepared[i] for i in tree], disable_tqdm), strict=True):
                results[i] = res
        in_tree = set(tree)
        order = sorted((i for i in scored if i not in in_tree), key=lambda i: -len(prepared[i][0]))
        for b in tqdm(range(0, len(order), self.batch_size), desc="loglikelihood", disable=disable_tqdm or None):
            idx = order[b : b + self.batch_size]
            logits = self._logits([prepared[i][0] for i in idx])
            for row, i in enumerate(idx):
                inp, cont = prepared[i]
                results[i] = _score(logits[row, len(inp) - len(cont) : len(inp)], cont)
        for (key, _, _), res in zip(requests, results, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
        return results

    @torch.no_grad()
    def _score_tree(self, prepared: list[tuple[list[int], list[int]]], disable_tqdm: bool = False):
        """Scores of (input, continuation) pairs whose inputs run once per distinct prefix
        (:class:`~mohge.evaluate.prefix_tree.PrefixTree`): the rows go ``batch_size`` at a time through
        :meth:`LanguageModel.hidden` with each token's depth as its position and its ancestors as what it sees, and
        the output head runs only on the nodes that predict a continuation token (once per node and target)."""
        from .prefix_tree import PrefixTree

        tree = PrefixTree()
        paths = [tree.add(inp) for inp, _ in prepared]
        number = tree.freeze()
        rows = tree.rows(self.tree_row_contexts * self.max_length)
        where = {}  # node -> (row, column) of the row that owns it
        for r, row in enumerate(rows):
            for col in range(len(row.nodes) - row.owned, len(row.nodes)):
                where[row.nodes[col]] = (r, col)
        pair: dict[tuple[int, int], int] = {}  # (node, target) -> its index; a node predicts one or more targets
        wants = []  # per request: the pair indices of its continuation tokens
        for path, (inp, cont) in zip(paths, prepared, strict=True):
            nodes = [number[n] for n in path[len(inp) - len(cont) :]]
            wants.append([pair.setdefault((node, tok), len(pair)) for node, tok in zip(nodes, cont, strict=True)])
        by_row: dict[int, list[tuple[int, int, int]]] = {}  # row -> (column, target, pair index)
        for (node, tok), k in pair.items():
            r, col = where[node]
            by_row.setdefault(r, []).append((col, tok, k))
        logp_K = torch.empty(len(pair))
        greedy_K = torch.empty(len(pair), dtype=torch.bool)
        for b in tqdm(range(0, len(rows), self.batch_size), desc="loglikelihood", disable=disable_tqdm or None):
            chunk = range(b, min(b + self.batch_size, len(rows)))
            ids, pos, mask = self._tree_batch(tree, [rows[r] for r in chunk])
            picks = [(r - b, col, tok, k) for r in chunk for col, tok, k in by_row.get(r, [])]
            if not picks:
                continue
            row_M, col_M, tok_M, k_M = (torch.tensor(v, dtype=torch.long) for v in zip(*picks, strict=True))
            with self._autocast():
                x_BPD, _ = self.model.hidden(ids.to(self._device), pos.to(self._device), mask.to(self._device))
                logits_MV = self.model.logits(x_BPD[row_M.to(self._device), col_M.to(self._device)])
            logp_MV = torch.log_softmax(logits_MV.float(), dim=-1).cpu()
            logp_K[k_M] = logp_MV.gather(1, tok_M[:, None])[:, 0]
            greedy_K[k_M] = logp_MV.argmax(-1) == tok_M
        return [(float(logp_K[w].sum()), bool(greedy_K[w].all())) for w in wants]

    def _tree_batch(self, tree, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids, positions and masks of packed rows (:meth:`PrefixTree.batch`); its own method so that a
        benchmark can count what runs."""
        return tree.batch(rows)

    def _left_padded(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids [B, P] of ``rows`` left-padded with the end-of-text token, and the mask [B, P] of real tokens."""
        B, P = len(rows), max(len(r) for r in rows)
        ids_BP = torch.full((B, P), self.eot, dtype=torch.long)
        mask_BP = torch.zeros((B, P), dtype=torch.long)
        for b, r in enumerate(rows):
            ids_BP[b, P - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask_BP[b, P - len(r) :] = 1
        return ids_BP, mask_BP

    def _hf_model(self):
        """The exported Hugging Face model on the same weights (built once): the forward pass with a KV cache."""
        from .hf_export import to_hf_model

        if self._hf is None:
            self._hf = to_hf_model(self.model, self.max_length, eot_id=self.eot)
        return self._hf

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, req in enumerate(requests):
            (text,) = req.args
            for ctx, cont in map(
                make_disjoint_window, get_rolling_token_windows(self.tok_encode(text), self.eot, self.max_length, 1)
            ):
                windows.append((None, ctx, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm), strict=True):
            totals[i] += ll
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ------------------------------------------------------------------------------------------------
    # generation
    # ------------------------------------------------------------------------------------------------

    def _gen_settings(self, kwargs: dict | None) -> tuple[list[str], int]:
        kwargs = dict(kwargs or {})
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
        if max_new >= self.max_length:
            raise ConfigError(f"max_gen_toks={max_new} must be below the model's max_length={self.max_length}")
        if kwargs.get("do_sample") or kwargs.get("temperature", 0.0):
            log.warning("generate_until is greedy; ignoring sampling arguments %s", kwargs)
        return until, max_new

    @torch.no_grad()
    def _generate_batch(self, contexts: list[list[int]], until: list[str], max_new: int) -> list[str]:
        """Greedy continuations of left-padded contexts, one forward pass per new token through the KV cache."""
        from transformers.cache_utils import DynamicCache

        hf = self._hf_model()
        B = len(contexts)
        ids_BP, mask_BP = self._left_padded(contexts)
        ids, mask = ids_BP.to(self._device), mask_BP.to(self._device)
        cache = DynamicCache(config=hf.config)
        new: list[list[int]] = [[] for _ in range(B)]
        texts, done = [""] * B, [False] * B
        with self._autocast():
            for _ in range(max_new):
                logits = hf(ids, attention_mask=mask, cache=cache, use_cache=True, logits_to_keep=1).logits
                nxt_B = logits[:, -1].float().argmax(-1)
                for b, tok in enumerate(nxt_B.tolist()):
                    if done[b]:
                        continue
                    if tok == self.eot:
                        done[b] = True
                        continue
                    new[b].append(tok)
                    texts[b] = self.tok_decode(new[b])
                    done[b] = any(u in texts[b] for u in until)
                if all(done):
                    break
                ids, mask = nxt_B[:, None], torch.cat([mask, mask.new_ones(B, 1)], dim=1)
        out = []
        for text in texts:
            for u in until:
                text = text.split(u, 1)[0]
            out.append(text)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        jobs: dict[tuple, list[int]] = {}  # requests with the same stopping rules share batches
        for i, req in enumerate(requests):
            until, max_new = self._gen_settings(req.args[1])
            jobs.setdefault((tuple(until), max_new), []).append(i)
        outputs = [""] * len(requests)
        bar = tqdm(total=len(requests), desc="generate_until", disable=disable_tqdm or None)
        for (until, max_new), idx in jobs.items():
            cap = self.max_length - max_new
            ctx = {i: (self.tok_encode(requests[i].args[0]) or [self.eot])[-cap:] for i in idx}
            idx = sorted(idx, key=lambda i: -len(ctx[i]))  # similar lengths together: less padding
            for b in range(0, len(idx), self.batch_size):
                chunk = idx[b : b + self.batch_size]
                for i, text in zip(
                    chunk, self._generate_batch([ctx[i] for i in chunk], list(until), max_new), strict=True
                ):
                    outputs[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return outputs
