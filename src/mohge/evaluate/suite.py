"""Evaluation of a trained model: lm-eval tasks built from held-out data, and held-out loss, fully offline.

    python -m mohge.evaluate --ckpt results/<run>/model --data data/<source> --out metrics.json [--tasks ...]
    python -m mohge.evaluate build-tasks --data data/<source> --ckpt MODEL --out TASKDIR   (or --max-length N)
    python -m mohge.evaluate trace --ckpt ... --data ... --out trace.json      (= mohge traces)
    python -m mohge.evaluate ... --route-override group_topk=2    (a cheaper routing, no retraining: .route_override)

Local tasks: the YAMLs in ``mohge/tasks`` are used as shipped, here and by lm-eval's own CLI
(``--include_path src/mohge/tasks``). They read their documents through ``mohge/tasks/mohge_task_data.py``
from the folder named by lm-eval's metadata ``task_data`` (default ``./mohge_tasks``), the jsonl files that
``build-tasks`` writes; ``evaluate`` builds them into a temporary folder (or ``--task-data``) and passes it.
Every document comes from the test split (``test_docs.jsonl``) and every draw is seeded by the task name and
document index, so the same data folder always gives byte-identical task files:

* ``mohge_ppl``        rolling log-likelihood of test passages (blank-line paragraphs merged to ~2000 chars).
* ``mohge_cloze``      LAMBADA-style last word, as 4-way multiple choice (not generation: a small model gets a
                       graded signal from the likelihood of the right word long before it generates it);
                       distractors are held-out words seen at least twice, case matched to the answer.
* ``mohge_hellaswag``  a ~600-char passage without its last line; that line against the last lines of 3 others.
* ``mohge_graded_{easy,medium,hard}``  graded corpus only: copy a line / verb agreement / sum answer.
* ``mohge_facts``      facts source only: every fact's value scored after ``<eot> key`` (loglikelihood), the
                       bits stored and exact recall (mohge.evaluate.bits_stored); built from the fact table (a
                       function of the data config in meta.json), never capped, and metrics.json's ``facts`` holds B.

Every task is built for one context length ``max_length`` (the model's: ``min(data.seq_len, model.max_seq_len)``):
a choice document is kept only when every choice, as the tokens lm-eval scores (the pair encoding of
``TemplateLM``), fits in it. Longer ones are dropped, counted in ``tasks.json``: lm-eval's ``hf`` model stops on
them (an assert) and any truncation would score a different quantity, so a document that no route can score
whole is no test. Both routes then give the same answer on every built document.

The eval section (tasks, limit, batch size) is that of ``--eval-config``, else, for a model folder
``work/<study>/runs/<run>``, the study's ``results/<study>/runs/<run>/config.json`` (as the workflow evaluates the
run), else the model folder's own (:mod:`.eval_section`); the log names it. Tasks named with ``--tasks`` must have
documents; of the eval section's ``eval.tasks`` (the default), those the data folder cannot build (graded tasks on
Shakespeare) are skipped with a warning and listed in metrics.json. A name that is no task is refused in one line.
With ``--route-override``, metrics.json's ``route_override`` also holds what a validation token costs at the served
routing, as routed (:mod:`.routed_cost`: forward FLOPs and activated matmul parameters, mean per token), and the
command prints it.

``--allow-hub`` lets lm-eval's standard tasks (``mohge/tasks/standard.yaml``) download their data; without it
HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1 are set and only local tasks run. metrics.json holds, per task,
lm-eval's metric values and stderrs (keys without lm-eval's ",none" filter suffix), and the val/test loss
and perplexity computed directly on the token files.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import yaml

from mohge.config import DataConfig, load_run_config
from mohge.config.provenance import code_version
from mohge.core.atomic import write_json_atomic, write_text_atomic
from mohge.core.cli import setup_logging, user_errors
from mohge.core.knobs import ConfigError, to_dict
from mohge.core.resources import TASKS
from mohge.data import load_meta
from mohge.data.graded import LEVEL_EASY, LEVEL_MEDIUM, VERBS
from mohge.data.loader import sealed_file
from mohge.data.tokenizer import encode, load_tokenizer
from mohge.train.checkpoint import check_trained_on
from mohge.train.heldout import heldout_loss

from .eval_section import eval_run_config
from .route_override import RouteOverride, apply_route_override
from .routed_cost import mean_cost

log = logging.getLogger("mohge.evaluate")

TASK_TEMPLATES = TASKS
GRADED_TASKS = ("mohge_graded_easy", "mohge_graded_medium", "mohge_graded_hard")
FACTS_TASK = "mohge_facts"  # facts source only: every fact, uncapped (mohge.evaluate.bits_stored)
LOCAL_TASKS = ("mohge_ppl", "mohge_cloze", "mohge_hellaswag", *GRADED_TASKS, FACTS_TASK)
_WORD = re.compile(r"[A-Za-z][A-Za-z']*[A-Za-z]")
_SUM = re.compile(r"\d+(?:\+\d+)+=\d+")
_VERB_FLIP = {**VERBS, **{pl: sg for sg, pl in VERBS.items()}}


# ----------------------------------------------------------------------------------------------------
# Task documents from held-out text
# ----------------------------------------------------------------------------------------------------


def passages(text: str, target_chars: int) -> list[str]:
    """Blank-line paragraphs merged in order until each passage has >= target_chars (a short tail joins
    the previous passage). A text without blank lines is one passage."""
    out: list[str] = []
    cur: list[str] = []
    for para in (p.strip("\n") for p in text.split("\n\n")):
        if para.strip():
            cur.append(para)
        if cur and sum(map(len, cur)) >= target_chars:
            out.append("\n\n".join(cur))
            cur = []
    if cur:
        tail = "\n\n".join(cur)
        if out and len(tail) < target_chars // 2:
            out[-1] += "\n\n" + tail
        else:
            out.append(tail)
    return out


def _choice_doc(context: str, answer: str, wrong: Sequence[str], rng: random.Random) -> dict[str, Any]:
    choices = [answer, *wrong]
    rng.shuffle(choices)
    return {"context": context, "choices": choices, "gold": choices.index(answer)}


def cloze_docs(texts: Sequence[str], name: str = "mohge_cloze") -> list[dict[str, Any]]:
    counts = Counter(w for t in texts for w in _WORD.findall(t))
    pool = sorted({w.lower() for w, c in counts.items() if c >= 2})
    docs = []
    for i, p in enumerate(q for t in texts for q in passages(t, 600)):
        words = list(_WORD.finditer(p))
        if not words or words[-1].start() < 200:
            continue
        answer = words[-1].group()
        rng = random.Random(f"{name}:{i}")
        wrong = rng.sample([w for w in pool if w != answer.lower()], 3)
        if answer[0].isupper():
            wrong = [w.capitalize() for w in wrong]
        docs.append(_choice_doc(p[: words[-1].start()], answer, wrong, rng))
    return docs


def hellaswag_docs(texts: Sequence[str], name: str = "mohge_hellaswag") -> list[dict[str, Any]]:
    items = []
    for p in (q for t in texts for q in passages(t, 600)):
        head, sep, last = p.rstrip().rpartition("\n")
        if sep and head.strip() and len(last.strip()) >= 10:
            items.append((head + sep, last))
    docs = []
    for i, (context, ending) in enumerate(items):
        rng = random.Random(f"{name}:{i}")
        others = [e for j, (_, e) in enumerate(items) if j != i and e != ending]
        if len(others) >= 3:
            docs.append(_choice_doc(context, ending, rng.sample(others, 3), rng))
    return docs


def _near_numbers(answer: int, rng: random.Random) -> list[str]:
    cands = {answer + d for d in (-100, -10, -2, -1, 1, 2, 10, 100)}
    digits = str(answer)
    if len(digits) > 1:
        cands.add(int(digits[::-1]))
    return [str(c) for c in rng.sample(sorted(c for c in cands if c >= 0 and c != answer), 3)]


def graded_docs(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per graded task, multiple-choice docs from the lines of the graded test documents."""
    all_lines = sorted({line for r in records for line in r["text"].split("\n")})
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in GRADED_TASKS}
    for d, rec in enumerate(records):
        text, levels, start = rec["text"], rec["levels"], 0
        for j, line in enumerate(text.split("\n")):
            lv, context = set(levels[start : start + len(line)]), text[:start]
            rng = random.Random(f"graded:{d}:{j}")
            if j and lv == {LEVEL_EASY}:
                wrong = rng.sample([x for x in all_lines if x not in context and x != line], 3)
                out["mohge_graded_easy"].append(_choice_doc(context, line, wrong, rng))
            elif lv == {LEVEL_MEDIUM}:
                words = line.split(" ")
                k = next((k for k, w in enumerate(words) if w in _VERB_FLIP), None)
                if k is not None:
                    flipped = " ".join(words[:k] + [_VERB_FLIP[words[k]]] + words[k + 1 :])
                    out["mohge_graded_medium"].append(_choice_doc(context, line, [flipped], rng))
            elif _SUM.fullmatch(line) and (lv_answer := set(levels[start + line.index("=") + 1 : start + len(line)])):
                # a sum's answer: the task of its level (hard in the mixed design; any level in the sums ladder)
                if len(lv_answer) == 1 and min(lv_answer) >= 0:
                    cut = line.index("=") + 1
                    answer = line[cut:]
                    wrong = _near_numbers(int(answer), rng)
                    task = GRADED_TASKS[min(lv_answer)]
                    out[task].append(_choice_doc(context + line[:cut], answer, wrong, rng))
            start += len(line) + 1
    return out


def continuation_tokens(tok: Any, context: str, continuation: str, eot: int) -> int:
    """Tokens lm-eval scores for (context, continuation): ``TemplateLM.loglikelihood`` and ``_encode_pair``
    (context's trailing whitespace moved to the continuation; the pair encoded whole and split at the context's
    length; an empty context is the end-of-text token)."""
    if not context:
        ids = encode(tok, continuation)
        return len(ids) - 1 if ids and ids[0] == eot else len(ids)
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    return len(encode(tok, context + continuation)) - len(encode(tok, context))


def fits(doc: dict[str, Any], tok: Any, max_length: int, eot: int) -> bool:
    """Every choice of a choice document fits in ``max_length`` tokens (lm-eval's ``hf`` asserts it); text
    documents (rolling perplexity) always fit: they are scored in windows."""
    if "choices" not in doc:
        return True
    return all(continuation_tokens(tok, doc["context"], c, eot) <= max_length for c in doc["choices"])


def build_tasks(
    data_dir: str | Path, out_dir: str | Path, max_docs: int = 1000, *, max_length: int, tokenizer: Any = None
) -> dict[str, int]:
    """Write ``{task}.jsonl`` for every local task into ``out_dir`` (deterministic); return docs per task.
    Only documents whose every choice fits in ``max_length`` tokens are kept (module docstring); ``tokenizer``
    defaults to the data folder's. Tasks that the data cannot support (graded tasks of a non-graded corpus, or
    none of whose documents fits) get no file."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if max_length < 1:
        raise ConfigError(f"max_length={max_length}: the model's context length must be >= 1")
    meta = load_meta(data_dir)
    tok = tokenizer if tokenizer is not None else load_tokenizer(data_dir / "tokenizer.json")
    eot = int(meta.get("eot_id", 0))
    docs_file = sealed_file(data_dir, "test_docs.jsonl", meta)  # size and sha256 as meta.json seals them
    records = [json.loads(line) for line in docs_file.read_text(encoding="utf-8").splitlines() if line]
    texts = [r["text"] for r in records]
    docs = {
        "mohge_ppl": [{"text": p} for t in texts for p in passages(t, 2000)],
        "mohge_cloze": cloze_docs(texts),
        "mohge_hellaswag": hellaswag_docs(texts),
    }
    if meta.get("source") == "graded":
        docs.update(graded_docs(records))
    if meta.get("source") == "facts":
        from mohge.data.facts import task_docs

        docs[FACTS_TASK] = task_docs(DataConfig.from_dict(meta["config"]))
    counts, dropped = {}, {}
    for name, rows in docs.items():
        # B is a sum over every fact: the facts task is neither filtered (a fact is 5 tokens) nor capped
        kept = rows if name == FACTS_TASK else [r for r in rows if fits(r, tok, max_length, eot)]
        if len(kept) < len(rows):
            dropped[name] = len(rows) - len(kept)
            log.info(
                "%s: %d of %d documents have a choice longer than %d tokens: dropped",
                name,
                dropped[name],
                len(rows),
                max_length,
            )
        kept = kept if name == FACTS_TASK else kept[:max_docs]
        if kept:
            write_text_atomic(out_dir / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
            counts[name] = len(kept)
    write_json_atomic(
        out_dir / "tasks.json",
        {
            "data_sha256": {"test_docs.jsonl": meta["files"]["test_docs.jsonl"]["sha256"]},
            "docs": counts,
            "max_length": max_length,
            "dropped": dropped,
        },
    )
    return counts


# ----------------------------------------------------------------------------------------------------
# Running lm-eval
# ----------------------------------------------------------------------------------------------------


def standard_tasks(templates: Path = TASK_TEMPLATES) -> list[str]:
    return list(yaml.safe_load((templates / "standard.yaml").read_text())["standard_tasks"])


def check_task_names(tasks: Sequence[str], allow_hub: bool, templates: Path = TASK_TEMPLATES) -> None:
    """Every task named is a local task or, with ``allow_hub``, one of lm-eval's: a name that is neither a local nor
    a standard task is refused here in one line; with the hub allowed, one that lm-eval does not know either is
    refused by :func:`run_lm_eval` (lm-eval's index is read there, once)."""
    standard = standard_tasks(templates)
    for name in tasks:
        if name in LOCAL_TASKS or (allow_hub and name not in standard):
            continue
        if name in standard:
            why = "a standard lm-eval task downloads its data from the HF hub (--allow-hub)"
            raise ConfigError(f"task {name!r}: {why}")
        raise ConfigError(
            f"task {name!r}: unknown (local tasks: {', '.join(LOCAL_TASKS)}; with --allow-hub also lm-eval's own, "
            f"such as {', '.join(standard)})"
        )


def check_task_docs(tasks: Sequence[str], task_data: Path) -> None:
    """Every local task named must have its documents in ``task_data``."""
    for name in tasks:
        if name in LOCAL_TASKS and not (task_data / f"{name}.jsonl").is_file():
            raise ConfigError(f"task {name!r} has no documents in {task_data} (graded tasks need a graded data folder)")


def go_offline() -> None:
    """HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1, also for `datasets` / `huggingface_hub` if already imported
    (they read the variables once, at import)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    if "datasets" in sys.modules:
        sys.modules["datasets"].config.HF_DATASETS_OFFLINE = True
        sys.modules["datasets"].config.HF_HUB_OFFLINE = True
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True


def _clean(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k.removesuffix(",none"): v for k, v in metrics.items() if k != "alias"}


@contextmanager
def _without_env_info() -> Iterator[None]:
    """lm-eval's ``simple_evaluate`` without its last step, ``add_env_info``: torch's environment report
    (``torch.utils.collect_env``, which starts subprocesses) and the packages' git hashes, written into fields of its
    results that :func:`run_lm_eval` does not read: about 0.5 s of CPU time, a fifth of a small evaluation job; every
    score is computed before it. lm-eval's module is as it was once the call returns."""
    import lm_eval.evaluator as evaluator

    real = evaluator.add_env_info
    evaluator.add_env_info = lambda results: None
    try:
        yield
    finally:
        evaluator.add_env_info = real


def run_lm_eval(
    lm: Any,
    tasks: Sequence[str],
    task_data: Path,
    limit: int = 0,
    allow_hub: bool = False,
    templates: Path = TASK_TEMPLATES,
) -> dict[str, dict[str, Any]]:
    """lm-eval's results per task for a ready model object (``MoHGELM``)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    hub = [t for t in tasks if t not in LOCAL_TASKS]
    check_task_names(tasks, allow_hub, templates)
    check_task_docs(tasks, task_data)
    # the shipped YAMLs as lm-eval's CLI reads them (--include_path), told where the documents are
    manager = TaskManager(
        include_path=str(templates), include_defaults=bool(hub), metadata={"task_data": str(task_data.resolve())}
    )
    for name in hub:
        if name not in manager.all_tasks:
            local = ", ".join(LOCAL_TASKS)
            raise ConfigError(f"task {name!r}: unknown to lm-eval and not a local task (local tasks: {local})")
    with _without_env_info():
        res = simple_evaluate(
            model=lm,
            tasks=list(tasks),
            limit=limit or None,
            task_manager=manager,
            log_samples=False,
            bootstrap_iters=1000,
        )
    out = {name: _clean(m) for name, m in res["results"].items()}
    for name, n in res.get("n-samples", {}).items():
        if name in out:
            out[name]["n_samples"] = n.get("effective", n)
    return out


def evaluate(
    ckpt: str | Path,
    data_dir: str | Path,
    tasks: Sequence[str] | None = None,
    limit: int | None = None,
    batch_size: int | None = None,
    device: str = "auto",
    allow_hub: bool = False,
    task_data: str | Path | None = None,
    max_loss_batches: int | None = None,
    templates: str | Path = TASK_TEMPLATES,
    eval_config: str | Path | None = None,
    route_override: RouteOverride | None = None,
) -> dict[str, Any]:
    """Everything metrics.json holds (see the module docstring); the eval section of the run config gives the
    defaults of tasks, limit, batch size and the val/test loss batches (``max_loss_batches``, 0 = the whole split).
    ``route_override`` serves the model with a cheaper routing (:mod:`.route_override`; every task and loss then sees
    it, and metrics.json records it)."""
    if tasks is not None:
        check_task_names(tasks, allow_hub, Path(templates))  # before the model loads
    if not allow_hub:
        go_offline()
    from .lm_eval_adapter import MoHGELM

    lm = MoHGELM(str(ckpt), device=device, batch_size=batch_size or 16)
    check_trained_on(ckpt, lm.cfg, data_dir)  # another tokenizer or data config: refused, naming both
    served = apply_route_override(lm.model, lm.cfg.model, route_override) if route_override else None
    # the workflow passes the run's current config: an eval-only change re-evaluates without retraining
    run_cfg, source = eval_run_config(ckpt, eval_config, lm.cfg)
    log.info("eval section: %s", source)
    ec = run_cfg.eval
    limit = ec.limit if limit is None else limit
    max_loss_batches = ec.heldout_batches if max_loss_batches is None else max_loss_batches
    lm.batch_size = batch_size or ec.batch_size
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mohge-tasks-") as tmp:
        folder = Path(task_data) if task_data else Path(tmp)
        built = build_tasks(data_dir, folder, max_length=lm.max_length, tokenizer=lm.tok)
        log.info("task documents in %s: %s", folder, built)
        skipped = []
        if tasks is None:  # the config's list serves every dataset: skip the tasks this data cannot build
            skipped = [t for t in ec.tasks if t in LOCAL_TASKS and t not in built]
            tasks = [t for t in ec.tasks if t not in skipped]
            if skipped:
                log.warning("no documents for %s in this data folder: skipped", skipped)
        results = run_lm_eval(lm, tasks, folder, limit, allow_hub, Path(templates)) if tasks else {}
    lm_eval_s = time.perf_counter() - t0
    metrics: dict[str, Any] = {"checkpoint": str(ckpt), "data": str(data_dir), "tasks": results}
    if FACTS_TASK in results:  # the bits stored, from lm-eval's per-fact log-likelihoods
        from .bits_stored import from_lm_eval

        metrics["facts"] = from_lm_eval(results[FACTS_TASK], DataConfig.from_dict(load_meta(data_dir)["config"]))
    # a served routing: what a validation token costs under it, counted on the loss pass (mohge.evaluate.routed_cost)
    loss_args = (lm.batch_size, lm.max_length, max_loss_batches, lm.autocast)
    with mean_cost(lm.model, lm.cfg.model) if route_override else nullcontext({}) as cost:
        metrics["val"] = heldout_loss(lm.model, data_dir, "val", *loss_args)
    metrics["test"] = heldout_loss(lm.model, data_dir, "test", *loss_args)
    metrics["lm_eval"] = {"limit": limit, "seconds": lm_eval_s, "task_docs": built, "skipped": skipped}
    if route_override:
        metrics["route_override"] = {"point": route_override.label(), "routing": served, "cost_split": "val", **cost}
    metrics["code"] = code_version(to_dict(run_cfg))  # which code made it, from which config (mohge.provenance)
    return metrics


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mohge evaluate",
        description="lm-eval tasks built from held-out data plus direct val/test loss, offline. Without a "
        "subcommand: evaluate a model (--ckpt, --data, --out).",
        epilog=f"Local tasks: {', '.join(LOCAL_TASKS)}. Standard (hub) tasks: {', '.join(standard_tasks())}.",
    )
    sub = ap.add_subparsers(dest="command", metavar="{build-tasks,trace}")
    bt = sub.add_parser("build-tasks", help="write the task documents (jsonl) of a data folder")
    bt.add_argument("--data", required=True, help="prepared data folder (python -m mohge.data)")
    bt.add_argument("--out", required=True, help="folder for {task}.jsonl and tasks.json")
    bt.add_argument("--max-docs", type=int, default=1000, help="documents per task at most (default 1000)")
    ctx = bt.add_mutually_exclusive_group(required=True)
    ctx.add_argument("--ckpt", help="trained model folder: the tasks fit its context (min(data.seq_len, max_seq_len))")
    ctx.add_argument("--max-length", type=int, help="the model's context length in tokens (instead of --ckpt)")
    sub.add_parser("trace", add_help=False, help="routing traces (takes the flags of mohge traces)")
    ap.add_argument("--ckpt", help="trained model folder (model.safetensors, config.json, tokenizer)")
    ap.add_argument("--data", help="prepared data folder the model was trained on")
    ap.add_argument("--out", help="metrics JSON to write")
    ap.add_argument("--tasks", nargs="+", help="task names (default: eval.tasks of the run config)")
    ap.add_argument("--limit", type=int, help="documents per task at most, 0 = all (default: eval.limit)")
    ap.add_argument("--batch-size", type=int, help="sequences per forward pass (default: eval.batch_size)")
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    ap.add_argument("--task-data", help="keep the task documents in this folder (default: a temporary one)")
    ap.add_argument(
        "--max-loss-batches",
        type=int,
        help="val/test loss over this many batches at most, 0 = all (default: eval.heldout_batches)",
    )
    ap.add_argument("--allow-hub", action="store_true", help="allow lm-eval's standard tasks to download data")
    ap.add_argument("--task-configs", default=str(TASK_TEMPLATES), help="folder of the task YAML templates")
    ap.add_argument(
        "--eval-config",
        help="run config whose eval section is read (default: for work/<study>/runs/<run>, the study's "
        "results/<study>/runs/<run>/config.json, as the workflow evaluates it; else the model folder's own)",
    )
    ap.add_argument(
        "--route-override",
        nargs="+",
        metavar="KEY=VALUE",
        help="serve a cheaper routing without retraining: group_topk=N, topk=N, bar_widest=N "
        "(mohge.evaluate.route_override)",
    )
    ap.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return ap


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command == "trace":  # everything after `trace` is for mohge.evaluate.traces
        from .traces import main as trace_main

        return trace_main(rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "build-tasks":
        if args.ckpt:
            cfg = load_run_config(Path(args.ckpt) / "config.json")
            args.max_length = min(cfg.data_config.seq_len, cfg.model.max_seq_len)  # = hf_export.context_length
        print(json.dumps(build_tasks(args.data, args.out, args.max_docs, max_length=args.max_length)))
        return 0
    missing = [f"--{k}" for k in ("ckpt", "data", "out") if getattr(args, k) is None]
    if missing:
        ap.error(f"the following arguments are required: {', '.join(missing)}")
    setup_logging(args.log_level)
    metrics = evaluate(
        args.ckpt,
        args.data,
        args.tasks,
        args.limit,
        args.batch_size,
        args.device,
        args.allow_hub,
        args.task_data,
        args.max_loss_batches,
        args.task_configs,
        args.eval_config,
        RouteOverride.parse(args.route_override) if args.route_override else None,
    )
    write_json_atomic(args.out, metrics)
    print(summary_table(metrics))
    print(f"written: {args.out}")
    return 0


def summary_table(metrics: dict) -> str:
    """What `mohge evaluate` prints when it is done: one line per task and metric (value, lm-eval's stderr where it
    gives one, documents), then the held-out splits' loss and perplexity; the JSON file holds the rest."""
    lines = [f"{'task':<24} {'metric':<18} {'value':>12} {'stderr':>10} {'n':>7}"]
    for task, m in sorted(metrics.get("tasks", {}).items()):
        for key, value in sorted(m.items()):
            if not isinstance(value, (int, float)) or key.endswith("_stderr") or key in ("n_samples", "sample_len"):
                continue
            err = m.get(f"{key}_stderr")
            err = f"{err:.4f}" if isinstance(err, (int, float)) else "—"
            lines.append(f"{task:<24} {key:<18} {value:>12.4f} {err:>10} {m.get('n_samples', ''):>7}")
    for split in ("val", "test"):  # n: the split's tokens
        for key in ("loss", "ppl") if split in metrics else ():
            lines.append(f"{split + ' split':<24} {key:<18} {metrics[split][key]:>12.4f} {'—':>10} "
                         f"{metrics[split]['tokens']:>7}")  # fmt: skip
    if "flops_per_token" in metrics.get("route_override", {}):
        served = metrics["route_override"]
        lines.append(
            f"route override {served['point']}: flops/token {served['flops_per_token']:.4g} (forward, as routed on "
            f"the {served['cost_split']} split's {served['tokens']} tokens), activated params/token "
            f"{served['params_per_token']:.4g}"
        )
    return "\n".join(lines)
