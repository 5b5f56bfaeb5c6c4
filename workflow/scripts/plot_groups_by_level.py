"""F3: which expert groups the tokens of each difficulty level are routed to (share of routed slots per group).

Inputs: groups (groups_by_level.csv). Outputs: png, pdf. Params: families (default: all present).
One panel per (dataset, family): the mean share over its n seeds (n in the panel title; error bars: 95% CI over
seeds where n >= 2); layer "all" when recorded, else slots summed over layers. Groups are labelled by their expert
width; the legend gives each level's share-weighted mean width.
"""

import mohge_studies.analysis.plotstyle as ps


def shares(df):
    """Mean and 95% CI half-width over runs of the share of routed slots per (dataset, family, level, group),
    with the group's width and n (runs)."""
    df = df.assign(layer=ps.as_level(df["layer"]))
    if (df["layer"] == "all").any():
        df = df[df["layer"] == "all"]
    keys = ["dataset", "family", "run", "level", "group", "width"]
    per_run = df.groupby(keys, as_index=False)["slots"].sum()
    per_run["share"] = per_run["slots"] / per_run.groupby(keys[:4])["slots"].transform("sum")
    out = ps.summarise(per_run, ["dataset", "family", "level", "group", "width"], ["share"])
    return out.rename(columns={"share_mean": "share", "share_ci95": "ci"})


def main(inputs: dict, outputs: dict, params: dict) -> None:
    """Plot the share of routed slots per expert group at each difficulty level (F3)."""
    df = ps.read_csv(inputs.get("groups"))
    if not df.empty and params.get("families"):
        df = df[ps.in_families(df["family"], params["families"])]
    if not df.empty:  # only corpora whose tokens carry difficulty levels (the graded corpus)
        df = df[df.groupby("run")["level"].transform(lambda lv: (lv.astype(str) != "all").any())]
    if df.empty:
        ps.placeholder_figure(outputs, "Expert groups by difficulty level", "no routing statistics recorded yet")
        return
    s = shares(df)
    levels = [lv for lv in ps.LEVELS if lv in set(s["level"])] or ps.ordered(s["level"], ())
    models = s[["dataset", "family"]].drop_duplicates()
    models = models.assign(_f=models["family"].map({f: i for i, f in enumerate(ps.FAMILIES)})).sort_values(
        ["dataset", "_f"]
    )
    fig, axes = ps.panels(len(models), ncols=2, height=2.6)
    for ax, (ds, fam) in zip(axes, models[["dataset", "family"]].itertuples(index=False), strict=True):
        d = s[(s["dataset"] == ds) & (s["family"] == fam)]
        groups = d.groupby("group")["width"].first().sort_index()
        bar = 0.8 / len(levels)
        for j, lv in enumerate(levels):
            lvd = d[d["level"] == lv].set_index("group").reindex(groups.index)
            v, ci = lvd["share"].fillna(0), lvd["ci"]
            mean_w = float((v * groups).sum() / v.sum()) if v.sum() else float("nan")
            x = [i + (j - (len(levels) - 1) / 2) * bar for i in range(len(groups))]
            ax.bar(
                x,
                v.values,
                width=bar,
                color=ps.LEVEL_COLORS.get(lv, ps.OTHER_COLOR),
                label=f"{lv}: mean width {mean_w:.0f}",
            )
            if ci.notna().any():
                # a share lies in [0, 1]: the interval is cut to it (intersecting with the range keeps coverage)
                c = ci.fillna(0).values
                below, above = (
                    [min(a, b) for a, b in zip(c, v.values, strict=True)],
                    [min(a, 1 - b) for a, b in zip(c, v.values, strict=True)],
                )
                ax.errorbar(x, v.values, yerr=[below, above], fmt="none", ecolor="#222222", lw=0.7, capsize=1.5)
        ax.axhline(1 / len(groups), color="#444444", ls=":", lw=0.9, label=f"uniform (1/{len(groups)})")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.9)  # headroom for the legend
        ax.grid(False, axis="x")
        ax.set_xticks(range(len(groups)), [str(w) for w in groups.values])
        ax.set_xlabel("expert group (labelled by expert width)")
        ax.set_ylabel("share of routed slots")
        n = int(d["n"].max())
        ax.set_title(f"{ds}: {ps.study_label(fam)} (n = {n} seed{'s' if n > 1 else ''})")
        ax.legend(title="difficulty level", title_fontsize=7.5, loc="upper left")
    many = (s["n"] >= 2).any()
    what = "one seed per model (n = 1): no CI"
    if many:
        what = "mean over the n seeds in each title, error bars: 95% CI cut to [0, 1]"
    fig.suptitle(f"Routed slots per expert group, by difficulty level\n({what})", fontsize=8.5)
    ps.save(fig, outputs.get("png"), outputs.get("pdf"))


if __name__ == "__main__":
    ps.run(main, globals().get("snakemake"))  # set by Snakemake's script: directive; None on the command line
