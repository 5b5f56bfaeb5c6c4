"""`mohge bench data`: the preparation path against `tokenizers`' own batch encode, same text, same run.

A corpus of about `--mb` MB is generated in a temporary folder (jsonl files of documents drawn from a Zipfian
vocabulary of made-up words, numbers and punctuation), and prepared through the hf source exactly as the
workflow does it: the tokenizer job (BPE on a bounded sample), one shard job, the gather job, each in its own
process so that its peak RSS (`os.wait4`'s ru_maxrss) is its own. The reference is `Tokenizer.encode_batch`
on the same documents in batches of the same size, timed around the call alone (reading excluded), in this
process. Both run on `--threads` threads (RAYON_NUM_THREADS); throughput is tokens/s per thread.
The shard job's time is its whole wall time: start-up, imports, streaming, hashing of the split, writing.

Targets: peak RSS < 1 GB for every job; prepare / encode_batch >= 0.7.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mohge.core.atomic import write_json_atomic

RSS_TARGET_MB, RATIO_TARGET = 1024, 0.7


def _words(rng: np.random.Generator, n: int) -> np.ndarray:
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    p = 1.0 / np.arange(1, 27)
    lengths = rng.integers(1, 11, size=n)
    return np.array(["".join(rng.choice(letters, size=k, p=p / p.sum())) for k in lengths])


def generate_corpus(folder: Path, mb: float, files: int = 8, seed: int = 0) -> int:
    """About `mb` MB of jsonl documents (text + id) in `files` files; returns the number of documents."""
    rng = np.random.default_rng(seed)
    vocab = _words(rng, 30000)
    punct = np.array([",", ".", ";", ":", "?", "!", " -", " 1", " 42", " 1999", " 3.14", "\n"])
    target, written, doc = int(mb * 1e6), 0, 0
    folder.mkdir(parents=True, exist_ok=True)
    handles = [open(folder / f"part-{i:03d}.jsonl", "w", encoding="utf-8") for i in range(files)]  # noqa: SIM115
    try:
        while written < target:
            n = int(rng.integers(100, 1500))
            idx = np.minimum(rng.zipf(1.15, size=n), len(vocab)) - 1
            toks = vocab[idx].astype(object)
            marks = rng.random(n) < 0.08
            toks[marks] = toks[marks] + punct[rng.integers(0, len(punct), size=int(marks.sum()))]
            text = " ".join(toks.tolist())
            line = json.dumps({"id": f"d{doc}", "text": text}) + "\n"
            handles[doc % files].write(line)
            written += len(line)
            doc += 1
    finally:
        for h in handles:
            h.close()
    return doc


# Runs `python -m mohge.data ...` and, at exit, writes the process's own peak RSS (VmHWM of /proc/self/status, in
# kB) to the file named by $MOHGE_BENCH_HWM. Not getrusage: ru_maxrss survives exec and would report the forking
# parent's size for a small child.
_WRAPPER = """
import atexit, os, runpy, sys
def _hwm():
    with open("/proc/self/status") as fh:
        kb = next(line.split()[1] for line in fh if line.startswith("VmHWM:"))
    with open(os.environ["MOHGE_BENCH_HWM"], "w") as out:
        out.write(kb)
atexit.register(_hwm)
sys.argv = ["mohge.data", *sys.argv[1:]]
runpy.run_module("mohge.data", run_name="__main__", alter_sys=True)
"""


def _run(args: list[str], env: dict[str, str], hwm_file: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one `python -m mohge.data` step in its own process."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _WRAPPER, *args], env={**env, "MOHGE_BENCH_HWM": str(hwm_file)},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"python -m mohge.data {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}"
        )
    return wall, int(hwm_file.read_text()) / 1024


def _batches(folder: Path, size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for path in sorted(folder.glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                text = json.loads(line)["text"]
                if text.strip():
                    batch.append(text)
                if len(batch) == size:
                    yield batch
                    batch = []
    if batch:
        yield batch


def reference(tokenizer_json: Path, corpus: Path, batch_docs: int) -> dict[str, float]:
    """tokenizers' encode_batch (and encode_batch_fast) on the same documents; seconds of the calls alone."""
    from mohge.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_json)
    out: dict[str, float] = {"tokens": 0, "encode_batch_s": 0.0, "encode_batch_fast_s": 0.0}
    for batch in _batches(corpus, batch_docs):
        t0 = time.perf_counter()
        encs = tok.encode_batch(batch, add_special_tokens=False)
        out["encode_batch_s"] += time.perf_counter() - t0
        out["tokens"] += sum(len(e) for e in encs) + len(batch)  # + one EOT per document, as the shards hold
        del encs
        t0 = time.perf_counter()
        tok.encode_batch_fast(batch, add_special_tokens=False)
        out["encode_batch_fast_s"] += time.perf_counter() - t0
    return out


def data_bench(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers first runs in parallel here
    with tempfile.TemporaryDirectory(prefix="mohge-bench-data-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        n_docs = generate_corpus(root / "corpus", args.mb)
        size_mb = sum(p.stat().st_size for p in (root / "corpus").iterdir()) / 1e6
        print(f"corpus: {size_mb:.1f} MB, {n_docs} documents in 8 jsonl files ({time.perf_counter() - t0:.0f} s)")
        data = {
            "source": "hf",
            "hf_name": "json",
            "hf_data_files": [str(root / "corpus" / "*.jsonl")],
            "hf_splits": {"train": "train"},
            "hf_id_field": "id",
            "val_fraction": 0.005,
            "test_fraction": 0.005,
            "vocab_size": args.vocab_size,
            "tokenizer_train_bytes": int(args.sample_mb * 1e6),
            "encode_batch_docs": args.batch_docs,
        }
        (root / "data.json").write_text(json.dumps({"data": data}))
        env = {**os.environ, "RAYON_NUM_THREADS": str(args.threads), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        common = ["--config", str(root / "data.json"), "--out", str(root / "out"), "--log-level", "WARNING"]
        jobs = {}
        for step, extra in (("tokenizer", []), ("shard", ["--index", "0"]), ("gather", [])):
            wall, rss = _run([step, *extra, *common], env, root / f"{step}.hwm")
            jobs[step] = {"seconds": wall, "peak_rss_mb": rss}
            print(f"  {step:<9} {wall:8.1f} s   peak RSS {rss:7.0f} MB")
        meta = json.loads((root / "out" / "meta.json").read_text())
        tokens = sum(meta["tokens"].values())
        ref = reference(root / "out" / "tokenizer.json", root / "corpus", args.batch_docs)
        assert ref["tokens"] == tokens, (ref["tokens"], tokens)  # the same text, the same tokens
    per_core = {
        "prepare": tokens / jobs["shard"]["seconds"] / args.threads,
        "encode_batch": tokens / ref["encode_batch_s"] / args.threads,
        "encode_batch_fast": tokens / ref["encode_batch_fast_s"] / args.threads,
    }
    ratio = per_core["prepare"] / per_core["encode_batch"]
    peak = max(j["peak_rss_mb"] for j in jobs.values())
    print(f"tokens: {tokens:,} (train {meta['tokens']['train']:,}, val {meta['tokens']['val']:,}, "
          f"test {meta['tokens']['test']:,}) on {args.threads} thread(s)")  # fmt: skip
    for k, v in per_core.items():
        print(f"  {k:<18} {v / 1e6:6.3f} M tokens/s per core")
    print(f"ratio prepare / encode_batch       = {ratio:.2f}   (target >= {RATIO_TARGET})")
    print(f"ratio prepare / encode_batch_fast  = {per_core['prepare'] / per_core['encode_batch_fast']:.2f}")
    print(f"peak RSS of a preparation job      = {peak:.0f} MB   (target < {RSS_TARGET_MB} MB)")
    return {
        "bench": "data",
        "corpus_mb": size_mb,
        "documents": n_docs,
        "tokens": tokens,
        "threads": args.threads,
        "vocab_size": args.vocab_size,
        "tokenizer_sample_mb": args.sample_mb,
        "jobs": jobs,
        "tokens_per_s_per_core": per_core,
        "ratio_prepare_over_encode_batch": ratio,
        "peak_rss_mb": peak,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mohge bench data", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the generated corpus (default 200 MB)")
    ap.add_argument("--threads", type=int, default=1, help="tokenizers threads (RAYON_NUM_THREADS) for both paths")
    ap.add_argument("--vocab-size", type=int, default=16384)
    ap.add_argument("--sample-mb", type=float, default=20.0, help="the BPE's training sample (tokenizer_train_bytes)")
    ap.add_argument("--batch-docs", type=int, default=1024, help="documents per encode_batch (encode_batch_docs)")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    if args.mb <= 0 or args.threads < 1:
        ap.error("--mb must be > 0 and --threads >= 1")
    out = data_bench(args)
    if args.json:
        write_json_atomic(args.json, out)
    return 0
