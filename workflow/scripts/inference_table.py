"""T4: every run's inference record (mohge bench inference) as one row per run and knob point, and the
table of means over seeds per dataset, model and knob point.

Inputs: records (results/<study>/inference/<run>.json). Outputs: rows (inference.csv), csv and md (T4_inference).
Columns: the knob point and the routing it serves, validation perplexity and loss, activated parameters and forward
FLOPs per token (mean over the n_tokens validation tokens, as routed), and for the trained routing the prefill and
cached-decode tokens/s of the record (one torch thread; the CPU is in the cpu column).
"""

import json
from pathlib import Path

import mohge_studies.analysis.plotstyle as ps
import pandas as pd

SPEED = ("prefill", "decode")


def rows(record: dict) -> list[dict]:
    out = []
    for m in record["models"]:
        speed = {f"prefill_{p['prompt_len']}_tok_s": p["ours_tokens_per_s"] for p in m.get("prefill", [])}
        speed.update({f"decode_b{d['batch']}_tok_s": d["tokens_per_s"] for d in m.get("decode", []) if d["cache"]})
        for k in m["knob"]:
            row = {
                "dataset": m["dataset"],
                "family": m["family"] + (f"+{m['variant']}" if m.get("variant") else ""),
                "run": m["run"],
                "point": k["point"],
                **{f"served_{key}": v for key, v in k["routing"].items()},
                "val_ppl": k["val_ppl"],
                "val_loss": k["val_loss"],
                "params_per_token": k["params_mean"],
                "flops_per_token": k["flops_mean"],
                "n_tokens": k["n_tokens"],
                "cpu": record.get("cpu", ""),
                "threads": record.get("threads"),
            }
            if k["point"] == "trained":
                row.update(speed)
            out.append(row)
    return out


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Collect the inference records into inference.csv and T4 (csv, md)."""
    records = inputs.get("records") or []
    records = [records] if isinstance(records, str) else list(records)
    df = pd.DataFrame([r for path in records for r in rows(json.loads(Path(path).read_text()))])
    Path(outputs["rows"]).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(outputs["rows"], index=False)
    cols = [c for c in df.columns if c.endswith(("_ppl", "_per_token", "_tok_s"))] if not df.empty else []
    table = (
        df.groupby(["dataset", "family", "point"], sort=True)
        .agg(n=("run", "nunique"), n_tokens=("n_tokens", "first"), **{c: (c, "mean") for c in cols})
        .reset_index()
        if not df.empty
        else pd.DataFrame(columns=["dataset", "family", "point", "n"])
    )
    Path(outputs["csv"]).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(outputs["csv"], index=False)
    Path(outputs["md"]).write_text(ps.pipe_table(table, CAPTION))


CAPTION = "**T4.** Validation perplexity against activated FLOPs per token, per served routing (mean of n runs)"


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
