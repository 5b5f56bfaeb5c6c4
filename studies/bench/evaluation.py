"""``mohge bench eval``: lm-eval over a trained model with each distinct prefix of the requests computed
once (the adapter's ``share_context``: a prefix tree packed in rows) against every request scored whole, in one run.

Both paths evaluate the same model on the same task documents (built once, as ``python -m mohge.evaluate`` builds
them), alternately, ``--reps`` times each; the clock is the thread's CPU time with one torch thread. The output holds
each path's median seconds, the speed-up (whole / shared), the largest difference of any task metric between the
paths (accuracies must be equal; perplexities and log-likelihood sums agree to rounding), and the tokens each path runs
through the model: ``token_bound`` (whole path's real tokens over the shared path's, which repeats the ancestors a
packed row needs) is the speed-up at equal cost per token. Two further bounds hold for any scheme that reuses
computation between requests (a KV cache, tree attention, a radix cache across documents):

* ``prefix_tokens``: the distinct prefixes of the model inputs of every request in the run (a trie over all of them,
  documents sharing a template prefix included); no scheme runs fewer tokens, so ``prefix_bound`` (whole path's real
  tokens over these) is the most any of them saves in tokens;
* ``model_s``: the seconds spent inside the model calls of each path; the rest of a path's time is lm-eval's and the
  adapter's own work, which no scoring scheme removes. ``bound_at_whole_cost`` is the whole path's time over that
  rest plus ``prefix_tokens`` at the whole path's measured cost per token run: the speed-up a scheme computing each
  distinct prefix once, with no padding, at the old path's cost per token, would reach.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import torch
from mohge.kernels.cpu_gemm import clock
from mohge_studies.bench.peers import machine

from mohge.core.atomic import write_json_atomic
from mohge.evaluate.prefix_tree import PrefixTree


def compare(whole: dict, shared: dict) -> dict[str, float]:
    """The largest absolute and relative difference over every numeric task metric (stderr terms left out)."""
    worst = {"abs": 0.0, "rel": 0.0}
    for task, metrics in whole.items():
        for key, a in metrics.items():
            b = shared[task][key]
            if isinstance(a, bool) or not isinstance(a, int | float) or "stderr" in key:
                continue
            worst["abs"] = max(worst["abs"], abs(a - b))
            worst["rel"] = max(worst["rel"], abs(a - b) / max(abs(a), 1e-30))
    return worst


def count_tokens(lm) -> dict[str, dict[str, float]]:
    """Wrap ``lm``'s two scoring paths so that each call adds to the returned counts: per path, the real tokens run
    through the model, the padded ones (the batch's rectangle) and the thread CPU seconds spent inside the path's
    calls (the whole path's forward and scoring; the tree path's building, packing, forward and scoring)."""
    counts = {k: {"real": 0, "padded": 0, "seconds": 0.0} for k in ("whole", "shared")}
    logits, score_tree, tree_batch = lm._logits, lm._score_tree, lm._tree_batch

    def timed(path: str, fn, *args):
        t0 = clock()
        try:
            return fn(*args)
        finally:
            counts[path]["seconds"] += clock() - t0

    def whole(rows):
        counts["whole"]["real"] += sum(map(len, rows))
        counts["whole"]["padded"] += len(rows) * max(map(len, rows))
        return timed("whole", logits, rows)

    def packed(tree, rows):
        counts["shared"]["real"] += sum(len(r.nodes) for r in rows)
        counts["shared"]["padded"] += len(rows) * max(len(r.nodes) for r in rows)
        return tree_batch(tree, rows)

    lm._logits, lm._tree_batch = whole, packed
    lm._score_tree = lambda prepared, disable_tqdm=False: timed("shared", score_tree, prepared, disable_tqdm)
    return counts


def count_prefixes(lm) -> PrefixTree:
    """Wrap ``lm._loglikelihood_tokens`` so that every request it scores adds its model input (context and
    continuation cut to the model's window, the last continuation token only a target) to the returned tree, whose
    length is then the number of distinct prefixes."""
    tree = PrefixTree()
    score = lm._loglikelihood_tokens

    def counted(requests, disable_tqdm: bool = False):
        for _, ctx, cont in requests:
            tree.add((ctx + cont)[-(lm.max_length + 1) : -1])
        return score(requests, disable_tqdm)

    lm._loglikelihood_tokens = counted
    return tree


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True, help="a trained model folder (what mohge.train writes)")
    ap.add_argument("--data", required=True, help="its prepared data folder")
    ap.add_argument(
        "--eval-config",
        help="the run's config.json, whose eval section gives tasks, limit, batch size (default: as mohge evaluate "
        "reads it, the study's for work/<study>/runs/<run>)",
    )
    ap.add_argument("--tasks", nargs="+", help="lm-eval tasks (default: the run's eval.tasks that this data builds)")
    ap.add_argument("--limit", type=int, help="documents per task (default: the run's eval.limit)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time clock)")
    ap.add_argument("--json", help="write the timings, ratio and differences here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from mohge.evaluate.eval_section import eval_run_config
    from mohge.evaluate.lm_eval_adapter import MoHGELM
    from mohge.evaluate.suite import LOCAL_TASKS, build_tasks, go_offline, run_lm_eval

    go_offline()
    lm = MoHGELM(args.ckpt, device="cpu", batch_size=16)
    ec = eval_run_config(args.ckpt, args.eval_config, lm.cfg)[0].eval
    lm.batch_size = ec.batch_size
    limit = ec.limit if args.limit is None else args.limit
    times: dict[str, list[float]] = {"whole": [], "shared": []}
    results: dict[str, dict] = {}
    tokens: dict[str, dict[str, int]] = {}
    model_s: dict[str, list[float]] = {"whole": [], "shared": []}
    with tempfile.TemporaryDirectory(prefix="mohge-tasks-") as tmp:
        built = build_tasks(Path(args.data), Path(tmp), max_length=lm.max_length, tokenizer=lm.tok)
        tasks = args.tasks or [t for t in ec.tasks if t not in LOCAL_TASKS or built.get(t)]
        for r in range(args.reps):
            for path in ("whole", "shared") if r % 2 == 0 else ("shared", "whole"):
                lm.share_context = path == "shared"
                counts = count_tokens(lm)
                prefixes = count_prefixes(lm)
                t0 = clock()
                results[path] = run_lm_eval(lm, tasks, Path(tmp), limit)
                times[path].append(clock() - t0)
                del lm._logits, lm._score_tree, lm._tree_batch, lm._loglikelihood_tokens  # the class's methods again
                tokens[path] = {k: counts["whole"][k] + counts["shared"][k] for k in ("real", "padded")}
                model_s[path].append(counts["whole"]["seconds"] + counts["shared"]["seconds"])
                print(f"{path:>6} rep {r}: {times[path][-1]:.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_model = {k: statistics.median(v) for k, v in model_s.items()}
    per_token = med_model["whole"] / tokens["whole"]["padded"]  # the whole path's cost per token run
    best = med["whole"] - med_model["whole"] + len(prefixes) * per_token
    out = {
        "ckpt": args.ckpt,
        "tasks": tasks,
        "limit": limit,
        "seconds": times,
        "median_s": med,
        "speedup_whole_over_shared": med["whole"] / med["shared"],
        "tokens": tokens,
        "token_bound": tokens["whole"]["real"] / tokens["shared"]["real"],
        "prefix_tokens": len(prefixes),
        "prefix_bound": tokens["whole"]["real"] / len(prefixes),
        "model_s": model_s,
        "median_model_s": med_model,
        "bound_at_whole_cost": med["whole"] / best,
        "max_metric_difference": compare(results["whole"], results["shared"]),
        "accuracies_equal": all(
            results["whole"][t][k] == results["shared"][t][k]
            for t in results["whole"]
            for k in results["whole"][t]
            if k.startswith("acc") and "stderr" not in k
        ),
        "threads": args.threads,
        "machine": machine(),
        "versions": {"torch": torch.__version__, "lm_eval": version("lm_eval")},
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "load_avg": os.getloadavg(),
    }
    print(
        f"lm-eval on {len(tasks)} tasks: whole {med['whole']:.1f} s, prefix tree {med['shared']:.1f} s, "
        f"{out['speedup_whole_over_shared']:.2f}x (bound by the tokens run: {out['token_bound']:.2f}x; by distinct "
        f"prefixes: {out['prefix_bound']:.2f}x in tokens, {out['bound_at_whole_cost']:.2f}x in time at the whole "
        f"path's cost per token); "
        f"largest metric difference {out['max_metric_difference']}, "
        f"accuracies equal: {out['accuracies_equal']}"
    )
    if args.json:
        write_json_atomic(args.json, out)
    return 0
