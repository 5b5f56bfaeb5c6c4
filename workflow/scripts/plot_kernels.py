"""F6: throughput of the grouped expert GEMM, TFLOP/s against the number of tokens T, for each kernel path, with the
bars of the device's dense bf16 peak; and, where recorded, the decode-shaped batch's bandwidth.

Inputs: kernels (kernels.csv: device, date, T, path, pass, ms, tflops; optional peak_tflops and, for pass decode,
gbps and share_of_hbm; may be absent or empty).
Outputs: png, pdf. Params: device (default: the device of the most recent GPU rows).
Rows from a CPU are not throughput numbers for the paper: without GPU rows the figure is a labelled placeholder.
"""

import mohge_studies.analysis.plotstyle as ps

PASSES = ("fwd", "fwd+bwd")
LABELS = ps.PATH_LABELS | {"hom_grouped_mm": "homogeneous MoE (equal FLOPs)", "mm": "torch.mm roofline (same M, N, K)"}
COLORS = ps.PATH_COLORS | {"hom_grouped_mm": ps.OTHER_COLOR, "mm": "#999999"}
REFERENCES = ("dense", "hom_grouped_mm", "mm")  # dashed: the references of equal FLOPs and the roofline
BARS = ((0.15, "floor"), (0.25, "good"), (0.40, "state of the art"))  # shares of peak (kernels/roofline.py)


def gpu_rows(df):
    if df.empty or not {"device", "T", "path", "pass", "tflops"} <= set(df.columns):
        return df.iloc[0:0]
    device = df["device"].fillna("").astype(str)
    return df[(device != "") & ~device.str.lower().str.contains("cpu") & df["tflops"].notna()]


def tokens_label(t: int) -> str:
    return f"{t // 1024}k" if t >= 1024 and t % 1024 == 0 else f"{t:,}"


def throughput_panel(ax, df, p: str, peak: float | None) -> None:
    ends = []
    for path in ps.ordered(df["path"], (*ps.PATHS, "hom_grouped_mm", "mm")):
        d = df[(df["pass"] == p) & (df["path"] == path)].groupby("T", as_index=False)["tflops"].median()
        if d.empty:
            continue
        color = COLORS.get(path, ps.OTHER_COLOR)
        dashed = path in REFERENCES
        ax.plot(d["T"], d["tflops"], marker="o", ms=3.5, color=color, ls="--" if dashed else "-")
        ends.append((d["T"].iloc[-1], d["tflops"].iloc[-1], LABELS.get(path, path), color))
    ax.set_xscale("log", base=2)
    ts = sorted(df.loc[df["pass"] == p, "T"].unique())
    ax.set_xticks(ts, [tokens_label(int(t)) for t in ts], minor=False)
    ax.minorticks_off()
    top = df.loc[df["pass"] == p, "tflops"].max()
    if peak:
        top = max(top, BARS[-1][0] * peak)
        for share, name in BARS:
            ax.axhline(share * peak, color="#BBBBBB", lw=0.8, ls=":", zorder=0)
            ax.text(
                ts[0],
                share * peak,
                f"{name}: {share:.0%} of peak",
                fontsize=6.5,
                color="#777777",
                va="bottom",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8},
            )
    ax.set_ylim(0, top * 1.08)
    ps.label_ends(ax, ends)
    ax.set_title(p)
    ax.set_xlabel("tokens T (log scale)")
    ax.set_ylabel("throughput (TFLOP/s)")


def decode_panel(ax, df) -> None:
    d = df[(df["pass"] == "decode") & df["gbps"].notna()]
    paths = ps.ordered(d["path"], ps.PATHS)
    for i, path in enumerate(paths):
        row = d[d["path"] == path].iloc[0]
        ax.bar(i, row["gbps"], color=COLORS.get(path, ps.OTHER_COLOR), width=0.6)
        known = "share_of_hbm" in d and row["share_of_hbm"] == row["share_of_hbm"]  # not NaN
        share = f"\n{row['share_of_hbm']:.0%} of HBM" if known else ""
        ax.text(i, row["gbps"], f"{row['gbps']:.0f} GB/s{share}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(paths)), [LABELS.get(p, p) for p in paths])
    ax.set_ylim(0, d["gbps"].max() * 1.35)
    ax.set_title(f"decode, T = {int(d['T'].iloc[0])}")
    ax.set_ylabel("expert weights read (GB/s)")


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot kernel throughput against T for each path (F6)."""
    df = gpu_rows(ps.read_csv(inputs.get("kernels")))
    if df.empty:
        ps.placeholder_figure(
            outputs,
            "F6 (placeholder): grouped-GEMM kernel throughput",
            "PLACEHOLDER: no GPU benchmark recorded yet\n(results/bench/kernels.csv has no GPU rows;\n"
            "run kernels/gpu_check.sh on a GPU and commit its CSV)",
        )
        return
    if "date" not in df:
        df = df.assign(date="")
    df = df.assign(date=df["date"].fillna("").astype(str))
    device = params.get("device") or df.sort_values("date")["device"].iloc[-1]
    df = df[df["device"] == device]
    date = df["date"].max()  # an ISO timestamp; one per benchmark run
    df = df[df["date"] == date]  # the most recent benchmark of that device
    peaks = df["peak_tflops"].dropna() if "peak_tflops" in df else df.iloc[0:0, 0]
    peak = float(peaks.iloc[0]) if len(peaks) else None
    passes = [p for p in ps.ordered(df["pass"], PASSES) if p != "decode"]
    decode = "gbps" in df and ((df["pass"] == "decode") & df["gbps"].notna()).any()
    fig, axes = ps.panels(len(passes) + decode, ncols=2, height=2.9)
    for ax, p in zip(axes, passes, strict=False):
        throughput_panel(ax, df, p, peak)
    if decode:
        decode_panel(axes[len(passes)], df)
    title = f"Grouped-GEMM kernel throughput on {device}" + (f" ({date[:10]})" if date else "")
    sub = "each point: the median of CUDA-event timings (triton.testing.do_bench)"
    if "mm" not in set(df["path"]):
        sub += ";\nno torch.mm roofline in this record"
    if peak:
        sub += f";\ndotted: shares of the device's dense bf16 peak, {peak:.0f} TFLOP/s"
    fig.suptitle(f"{title}\n{sub}", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
