"""The capacity pilot's record: one row per finished pilot run and its curve of bits stored against exposures.

    python studies/capacity/scripts/pilot_table.py [--pilot results/capacity/pilot] [--fig figures/capacity]

Reads every PILOT/<name>/{summary,config}.json and curve.csv (studies/capacity/scripts/pilot.py); writes
PILOT/pilot.csv and PILOT/pilot.md (model, parameters, data, exposures, tokens/s, final B by both routes,
bits per non-embedding parameter) and FIG/pilot_curves.{png,pdf} (B against exposures, one line per run).
"""

import argparse
import json
import sys
from pathlib import Path

import mohge_studies.analysis.plotstyle as ps
import pandas as pd


def model_label(cfg: dict) -> str:
    ffn = cfg["model"]["ffn"]
    if ffn["kind"] == "dense":
        return f"dense-{ffn['dense_width']}"
    return f"{ffn['kind']}-{'/'.join(map(str, ffn['expert_widths']))}x{ffn['num_experts']}"


def rows(pilot: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    table, curves = [], []
    for summary_path in sorted(pilot.glob("*/summary.json")):
        d = summary_path.parent
        s, cfg = json.loads(summary_path.read_text()), json.loads((d / "config.json").read_text())
        curve = pd.read_csv(d / "curve.csv").assign(run=d.name)
        curves.append(curve)
        data, tr = cfg["data"], cfg["train"]
        p_ne = s["params"]["total_non_embedding"]
        last = curve.iloc[-1]
        half = curve[curve.exposures <= last.exposures * 0.75].iloc[-1] if len(curve) > 1 else last
        table.append(
            {
                "run": d.name,
                "model": model_label(cfg),
                "params_non_embedding": p_ne,
                "facts": data["facts_num"],
                "data_kbit": s["total_bits"] / 1e3,
                "exposures": last.exposures,
                "lr": tr["lr"],
                "min_lr": tr["min_lr"],
                "weight_decay": tr["weight_decay"],
                "tokens_per_s": round(s["tokens_per_s"]),
                "B_kbit": last.bits_stored / 1e3,
                "B_kbit_lm_eval": s["final_lm_eval"]["bits_stored"] / 1e3 if s["final_lm_eval"] else float("nan"),
                "B_kbit_at_75pct": half.bits_stored / 1e3,
                "bits_per_param": last.bits_stored / p_ne,
                "fraction_of_data": last.bits_stored / s["total_bits"],
                "recall": last.recall,
                "partial": bool(s.get("partial", False)),  # stopped early: its last checkpoint, same schedule
                "started_utc": s.get("started_utc"),
            }
        )
    return pd.DataFrame(table), (pd.concat(curves) if curves else pd.DataFrame())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pilot", default="results/capacity/pilot")
    ap.add_argument("--fig", default="figures/capacity")
    args = ap.parse_args(argv)
    pilot = Path(args.pilot)
    table, curves = rows(pilot)
    table.to_csv(pilot / "pilot.csv", index=False, float_format="%.6g", lineterminator="\n")
    shown = table.drop(columns=["started_utc"]).round(3)
    head = list(shown.columns)
    lines = [f"| {' | '.join(head)} |", f"|{'|'.join(['---'] * len(head))}|"]
    lines += [f"| {' | '.join(str(v) for v in r)} |" for r in shown.values.tolist()]
    note = "B_kbit: direct route on the final model; B_kbit_lm_eval: the same model through lm-eval (mohge_facts)."
    (pilot / "pilot.md").write_text("**Capacity pilot.** One row per run.\n\n" + "\n".join(lines) + f"\n\n- {note}\n")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for run, g in curves.groupby("run", sort=True) if len(curves) else []:
        row = table.set_index("run").loc[run]
        ax.plot(g.exposures, g.bits_stored / 1e3, marker=".", label=f"{run}: {row.model}, {row.facts} facts")
        ax.axhline(row.data_kbit, color="black", lw=0.5, ls=":")
    ax.set_xlabel("exposures per fact")
    ax.set_ylabel("bits stored B (kbit); dotted: the data's bits")
    ax.legend(fontsize=6)
    fig.tight_layout()
    ps.save(fig, Path(args.fig) / "pilot_curves.png", Path(args.fig) / "pilot_curves.pdf")
    print(shown.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
