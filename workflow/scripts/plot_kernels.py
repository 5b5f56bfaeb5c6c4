"""F6: throughput of the grouped expert GEMM, TFLOP/s against the number of tokens T, for each kernel path.

Inputs: kernels (kernels.csv: device, date, T, path, pass, ms, tflops; may be absent or empty).
Outputs: png, pdf. Params: device (default: the device of the most recent GPU rows).
Rows from a CPU are not throughput numbers for the paper: without GPU rows the figure is a labelled placeholder.
"""

import mohge.analysis.plotstyle as ps

PASSES = ("fwd", "fwd+bwd")


def gpu_rows(df):
    if df.empty or not {"device", "T", "path", "pass", "tflops"} <= set(df.columns):
        return df.iloc[0:0]
    device = df["device"].fillna("").astype(str)
    return df[(device != "") & ~device.str.lower().str.contains("cpu") & df["tflops"].notna()]


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
    passes = ps.ordered(df["pass"], PASSES)
    fig, axes = ps.panels(len(passes), ncols=2, height=2.7)
    for ax, p in zip(axes, passes, strict=True):
        ends = []
        for path in ps.ordered(df["path"], ps.PATHS):
            d = df[(df["pass"] == p) & (df["path"] == path)].groupby("T", as_index=False)["tflops"].median()
            if d.empty:
                continue
            color = ps.PATH_COLORS.get(path, ps.OTHER_COLOR)
            ax.plot(d["T"], d["tflops"], marker="o", ms=3.5, color=color)
            ends.append((d["T"].iloc[-1], d["tflops"].iloc[-1], ps.PATH_LABELS.get(path, path), color))
        ax.set_xscale("log", base=2)
        ts = sorted(df["T"].unique())
        if len(ts) <= 8:
            ax.set_xticks(ts, [f"{t:,}" for t in ts], minor=False)
            ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ps.label_ends(ax, ends)
        ax.set_title(f"{p}")
        ax.set_xlabel("tokens T (log scale)")
        ax.set_ylabel("throughput (TFLOP/s)")
    reps = int(df.groupby(["pass", "path", "T"]).size().max())
    title = f"Grouped-GEMM kernel throughput on {device}" + (f" ({date[:10]})" if date else "")
    fig.suptitle(f"{title}\nmedian of n = {reps} timing{'s' if reps > 1 else ''} per point (CUDA events)", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
