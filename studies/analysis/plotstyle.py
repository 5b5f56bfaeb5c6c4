"""Shared style and glue of every table and figure script: colours, labels, statistics, saving, invocation.

Figures never need a GPU: the scripts import pandas, matplotlib and this module, nothing
else; this module takes its statistics from mohge.core.stats (numpy and scipy, no torch).
Saving strips every timestamp and version string, so a figure rebuilt from unchanged data is byte-identical.
Scripts run by Snakemake's ``script:`` directive get a preamble prepended (Snakemake 9.27), so they must not
use ``from __future__ import``; they import this module from the installed package
(``mohge_studies.analysis.plotstyle``).
The tables' writers (CSV, Markdown, LaTeX, HTML) live here too, shared by make_tables.py and the study scripts.
Colours are the Okabe-Ito palette (safe under the common colour-vision deficiencies); each family also has its
own marker, so the figures read in greyscale too.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import math
import re
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mohge.core import stats  # noqa: E402

FAMILIES = ("mohge", "moe", "moe_equal", "hmoe", "modse", "dense")
FAMILY_COLORS = {
    "mohge": "#D55E00",  # vermillion: the method
    "moe": "#0072B2",  # blue
    "moe_equal": "#56B4E9",  # sky blue: the same architecture as moe, narrower
    "hmoe": "#009E73",  # bluish green
    "modse": "#CC79A7",  # reddish purple
    "dense": "#555555",  # grey
}
FAMILY_MARKERS = {"mohge": "o", "moe": "s", "moe_equal": "D", "hmoe": "^", "modse": "v", "dense": "X"}
FAMILY_LABELS = {
    "mohge": "MoHGE",
    "moe": "MoE",
    "moe_equal": "MoE (equal-parameter)",
    "hmoe": "HMoE",
    "modse": "MoDSE",
    "dense": "Dense",
}
STRATEGIES = ("contiguous", "all_size", "modse_pairs", "flop_lpt")
STRATEGY_COLORS = {"contiguous": "#E69F00", "all_size": "#D55E00", "modse_pairs": "#CC79A7", "flop_lpt": "#009E73"}
STRATEGY_LABELS = {
    "contiguous": "contiguous",
    "all_size": "all-size (MoHGE)",
    "modse_pairs": "MoDSE pairs",
    "flop_lpt": "FLOP-greedy (LPT; in-sample oracle)",
}
LEVELS = ("easy", "medium", "hard")
LEVEL_COLORS = {"easy": "#9ECAE1", "medium": "#4292C6", "hard": "#08306B"}  # light to dark: ordinal
PATHS = ("triton", "triton_graph", "grouped_mm", "dense", "loop", "torch")
PATH_COLORS = {
    "triton": "#D55E00",
    "triton_graph": "#E69F00",
    "dense": "#555555",
    "loop": "#0072B2",
    "torch": "#009E73",
    "grouped_mm": "#CC79A7",
}
PATH_LABELS = {  # the paths of mohge.kernels.bench
    "triton": "Triton",
    "triton_graph": "Triton, one CUDA graph",
    "dense": "dense (equal FLOPs)",
    "loop": "loop (release)",
    "torch": "torch grouped",
    "grouped_mm": "F.grouped_mm",
}
OTHER_COLOR = "#999999"
PNG_DPI = 200
PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}
# Single and double column widths of a two-column paper, inches.
WIDTH_1COL, WIDTH_2COL = 3.4, 7.0

plt.rcParams.update(
    {
        "font.size": 9,
        "axes.titlesize": 9.5,
        "axes.labelsize": 9,
        "xtick.labelsize": 8,
        "ytick.labelsize": 8,
        "legend.fontsize": 7.5,
        "legend.frameon": False,
        "figure.titlesize": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "grid.linewidth": 0.5,
        "lines.linewidth": 1.5,
        "lines.markersize": 5,
        "figure.constrained_layout.use": True,
        "pdf.fonttype": 42,  # TrueType in the PDF: text stays selectable and editable
        "svg.hashsalt": "mohge",
    }
)


def family_label(family: str, width: int | None = None) -> str:
    """'MoHGE', 'MoE (1024)' when the homogeneous width is given, ...; unknown names pass through."""
    base, _, variant = str(family).partition("+")  # "mohge+renorm": a variant of a family
    label = f"MoE ({width})" if width is not None and base in ("moe", "moe_equal") else FAMILY_LABELS.get(base, base)
    if not variant:
        return label
    named = variant_label(variant)
    return f"{label}, {named}" if named != variant else f"{label} [{variant}]"


def family_style(family: str) -> dict:
    """Colour and marker of the family; a variant keeps its family's colour and takes a hollow marker."""
    base, _, variant = str(family).partition("+")
    style = {"color": FAMILY_COLORS.get(base, OTHER_COLOR), "marker": FAMILY_MARKERS.get(base, "o")}
    if variant:
        style.update(markerfacecolor="white", ls="--")
    return style


_COEFF = re.compile(r"(ae|ag)(\d+)e(\d+)")  # variant tags of the loss sweeps: ae2e1 = alpha_E 2e-1
_WIDTH = re.compile(r"w(\d+)")  # the width sweep: moe+w160 = the homogeneous MoE at width 160
_LR = re.compile(r"lr(\d+)(?:p(\d+))?e(\d+)")  # the lr sweep: lr1p5e3 = lr 1.5e-3
# the control arms of the claims study (studies/claims/config.yaml): F12 draws their tests, F7 leaves them out
CONTROL_VARIANTS = ("hom208", "renorm", "probsgate", "noaux")
VARIANT_NAMES = {
    "hom208": "all widths 208",
    "renorm": "product_renorm gate",
    "probsgate": "softmax-of-top-k-probs gate",
    "noaux": "no balance loss",
    "ag0": "α_G = 0",
    "ag1": "α_G = 1",
    "ag10": "α_G = 10",
    "ag1rel": "α_G = 1, ω∝h",  # cost weights spanning the widths (group_cost_interval 96)
    "ae0": "α_E = 0",
}
VARIANT_LINESTYLES = ("--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)))
VARIANT_MARKERS = ("^", "v", "P", "h", "*")


def control_arm(family: str) -> bool:
    """A control arm of the claims study: a gate, width or balance-loss control, or an lr-sweep arm."""
    variant = str(family).partition("+")[2]
    return variant in CONTROL_VARIANTS or bool(_LR.fullmatch(variant))


def variant_label(variant: str) -> str:
    """'α_E = 0.2' for ae2e1, 'α_G = 1e-5' for ag1e5, 'lr 1.5e-3' for lr1p5e3, a control arm's name
    (VARIANT_NAMES), the tag itself otherwise."""
    if variant in VARIANT_NAMES:
        return VARIANT_NAMES[variant]
    lr = _LR.fullmatch(variant)
    if lr:
        return f"lr {lr.group(1)}{'.' + lr.group(2) if lr.group(2) else ''}e-{lr.group(3)}"
    m = _COEFF.fullmatch(variant)
    if not m:
        return variant
    mant, exp = int(m.group(2)), int(m.group(3))
    value = f"{mant * 10.0**-exp:g}" if exp <= 2 else f"{mant}e-{exp}"
    return f"{'α_E' if m.group(1) == 'ae' else 'α_G'} = {value}"


def study_label(family: str) -> str:
    """A readable name for a family or variant: 'MoE-160' for moe+w160, 'MoHGE, α_G = 1e-5' for mohge+ag1e5."""
    base, _, variant = str(family).partition("+")
    w = _WIDTH.fullmatch(variant)
    if w and base in ("moe", "moe_equal"):
        return f"MoE-{w.group(1)}"
    if variant and variant_label(variant) != variant:
        return f"{study_label(base)}, {variant_label(variant)}"
    return family_label(family)


def line_styles(families: Iterable[str]) -> dict[str, dict]:
    """Colour, line style and marker per family so that variants of one family differ from each other: the
    family itself solid with its own marker, its variants (in sorted order) each in its own dash pattern,
    marker and shade of the family's colour (lighter, then darker)."""
    out, seen = {}, {}
    for fam in sorted(dict.fromkeys(map(str, families)), key=lambda f: ("+" in f, f)):
        base, _, variant = fam.partition("+")
        color = FAMILY_COLORS.get(base, OTHER_COLOR)
        if not variant:
            out[fam] = {"color": color, "ls": "-", "marker": FAMILY_MARKERS.get(base, "o")}
            continue
        i = seen[base] = seen.get(base, -1) + 1
        shade = (0.35, -0.35, 0.15, -0.6, 0.55)[i % 5]  # > 0: towards white, < 0: towards black
        rgb = [c + (1 - c) * shade if shade > 0 else c * (1 + shade) for c in matplotlib.colors.to_rgb(color)]
        out[fam] = {
            "color": matplotlib.colors.to_hex(rgb),
            "ls": VARIANT_LINESTYLES[i % len(VARIANT_LINESTYLES)],
            "marker": VARIANT_MARKERS[i % len(VARIANT_MARKERS)],
        }
    return out


def in_families(family: pd.Series, families) -> pd.Series:
    """Rows whose family, or the family a variant belongs to ("mohge+renorm" -> mohge), is in ``families``."""
    return family.astype(str).str.partition("+")[0].isin(list(families))


def strategy_label(strategy: str) -> str:
    return STRATEGY_LABELS.get(strategy, str(strategy))


def ordered(values: Iterable, order: Iterable) -> list:
    """The distinct values, those named in ``order`` first in that order, the rest sorted after them."""
    present = list(dict.fromkeys(values))
    order = list(order)
    return [v for v in order if v in present] + sorted((v for v in present if v not in order), key=str)


# ---- statistics: mean and 95% confidence interval over seeds (Student t; mohge.core.stats) ----------------------
def mean_ci(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95% CI, n) of the non-missing values; the half-width is NaN with one value."""
    s = pd.Series(list(values), dtype=float).dropna()
    return (float(s.mean()) if len(s) else math.nan), stats.one_sample(s.to_numpy()).half_width(0.05), len(s)


def summarise(df: pd.DataFrame, by: list[str], cols: list[str]) -> pd.DataFrame:
    """One row per ``by`` group: n, then <col>_mean and <col>_ci95 of every column (over seeds)."""
    rows = []
    for key, g in df.groupby(by, sort=False, dropna=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)) | {"n": len(g)}
        for c in cols:
            row[f"{c}_mean"], row[f"{c}_ci95"], _ = mean_ci(g[c])
        rows.append(row)
    return pd.DataFrame(rows, columns=[*by, "n", *(f"{c}_{s}" for c in cols for s in ("mean", "ci95"))])


def param_scale(values: Iterable[float]) -> tuple[float, str]:
    """(divisor, unit) that brings parameter counts to a readable size: K, M or B."""
    top = max((abs(v) for v in values if v == v), default=0.0)
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if top >= div:
            return div, unit
    return 1.0, ""


# ---- reading and drawing ------------------------------------------------------------------------------------
def read_csv(path: str | Path | None) -> pd.DataFrame:
    """The CSV, or an empty frame when the path is missing, absent or has no rows."""
    if not path or not Path(path).is_file() or Path(path).stat().st_size == 0:
        return pd.DataFrame()
    return pd.read_csv(path)


def as_level(series: pd.Series) -> pd.Series:
    """A ``layer`` column mixes ints and 'all': compare it as strings."""
    return series.astype(str)


def min_span(ax, axis: str = "y", rel: float = 0.04) -> bool:
    """Widen the ``axis`` limits around their centre to at least ``rel`` of the centre's magnitude, so that
    differences far below the noise (0.01 ppl) do not fill a whole panel; True when the limits were widened."""
    get, set_ = (ax.get_ylim, ax.set_ylim) if axis == "y" else (ax.get_xlim, ax.set_xlim)
    lo, hi = get()
    centre = (lo + hi) / 2
    need = abs(centre) * rel
    if hi - lo >= need or need == 0:
        return False
    set_(centre - need / 2, centre + need / 2)
    return True


def n_text(ns: Iterable[int]) -> str:
    """'n = 3 seeds' or 'n = 1-8 seeds': the number of seeds behind a set of means."""
    ns = sorted({int(n) for n in ns})
    if not ns:
        return "n = 0"
    span = str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    return f"n = {span} seed{'s' if ns[-1] > 1 else ''}"


def label_ends(ax, items: list[tuple[float, float, str, str]], min_gap: float = 0.06) -> None:
    """Direct labels to the right of line ends: items (x, y, text, colour), nudged apart by ``min_gap`` of the axis."""
    lo, hi = ax.get_ylim()
    gap = (hi - lo) * min_gap
    placed: list[float] = []
    for x, y, text, color in sorted(items, key=lambda it: it[1]):
        y = max(y, placed[-1] + gap) if placed else y
        placed.append(y)
        ax.annotate(text, (x, y), xytext=(6, 0), textcoords="offset points", va="center", color=color, fontsize=7.5)


def placeholder(ax, message: str) -> None:
    """An empty panel that says why it is empty (a figure is always produced, and always honest)."""
    ax.set_axis_off()
    ax.text(
        0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="#444444", wrap=True
    )


def placeholder_figure(outputs: dict, title: str, message: str) -> None:
    fig, ax = plt.subplots(figsize=(WIDTH_1COL * 1.5, 2.4))
    fig.suptitle(title)
    placeholder(ax, message)
    save(fig, outputs.get("png"), outputs.get("pdf"))


def save(fig, png_path: str | Path | None, pdf_path: str | Path | None) -> None:
    """PNG at a fixed dpi and PDF, both without timestamps or software versions: reruns are byte-identical."""
    for path, kwargs in (
        (png_path, {"dpi": PNG_DPI, "metadata": PNG_METADATA}),
        (pdf_path, {"metadata": PDF_METADATA}),
    ):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, **kwargs)
    plt.close(fig)


# ---- invocation: Snakemake's script: directive or the command line -------------------------------------------
def _pairs(items: list[str] | None, parse: bool = False) -> dict:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r}: expected key=value")
        if parse:
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
        out[key] = value
    return out


def run(main: Callable[[dict, dict, dict], None], smk=None) -> None:
    """Call ``main(inputs, outputs, params)`` from the ``snakemake`` object (logging to its log) or from argv."""
    if smk is None:
        p = argparse.ArgumentParser(description=(main.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--in", dest="inputs", action="append", metavar="KEY=PATH", help="an input file")
        p.add_argument("--out", dest="outputs", action="append", metavar="KEY=PATH", help="an output file")
        p.add_argument("--param", dest="params", action="append", metavar="KEY=VALUE", help="a parameter (JSON)")
        a = p.parse_args()
        main(_pairs(a.inputs), _pairs(a.outputs), _pairs(a.params, parse=True))
        return
    args = dict(smk.input.items()), dict(smk.output.items()), dict(smk.params.items())
    if not smk.log:
        main(*args)
        return
    with open(smk.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            main(*args)
        except Exception:
            traceback.print_exc()
            raise


# ---- shared panels --------------------------------------------------------------------------------------------
def panels(n: int, ncols: int = 3, height: float = 2.5, width: float | None = None):
    """A figure with ``n`` panels on a grid of at most ``ncols`` columns; returns (fig, list of axes)."""
    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    width = width or (WIDTH_1COL * 1.3 if ncols == 1 else WIDTH_2COL)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_axis_off()
    return fig, flat[:n]


def mean_band(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per ``x``: mean of ``y`` over the rows (seeds) and the 95% CI band lo/hi (NaN where one seed)."""
    g = df.dropna(subset=[y]).groupby(x)[y]
    out = pd.DataFrame({"mean": g.mean(), "std": g.std(), "n": g.count()})
    hw = stats.t_half_width(out["std"].to_numpy(), out["n"].to_numpy(), 0.05)
    return out.assign(lo=out["mean"] - hw, hi=out["mean"] + hw).reset_index()


def curve_panel(ax, df: pd.DataFrame, y: str, smooth: int = 0, families: Iterable[str] | None = None) -> list:
    """Mean over seeds of ``y`` against step for each family, with its 95% CI band. Each run is first smoothed
    by a trailing moving average of ``smooth`` logged points (0: about 2% of the run). Returns end labels."""
    ends = []
    styles = line_styles(df["family"].unique())
    for fam in [f for f in ordered(df["family"], FAMILIES) if not families or f.partition("+")[0] in families]:
        runs = df[(df["family"] == fam) & df[y].notna()].sort_values("step")
        if runs.empty:
            continue
        win = smooth or max(1, runs.groupby("run").size().max() // 50)
        runs = runs.assign(_y=runs.groupby("run")[y].rolling(win, min_periods=1).mean().droplevel(0))
        band = mean_band(runs, "step", "_y")
        st = styles[str(fam)]
        ax.plot(band["step"], band["mean"], color=st["color"], ls=st["ls"], lw=1.3)
        ax.fill_between(band["step"], band["lo"], band["hi"], color=st["color"], alpha=0.15, lw=0)
        n = runs["run"].nunique()
        ends.append((band["step"].iloc[-1], band["mean"].iloc[-1], f"{study_label(fam)} (n={n})", st["color"]))
    return ends


# ---- the study tables (mohge_studies.claims.analysis: S1_models, S2_tests, S3_balance, S4_difficulty) ------------
def ci_err(mean: pd.Series, low: pd.Series, high: pd.Series) -> list[list[float]]:
    """Asymmetric error bars [below, above] from a table's CI bounds; 0 where there is no interval (n = 1)."""
    below = (mean - low).where(low.notna(), 0.0).clip(lower=0)
    above = (high - mean).where(high.notna(), 0.0).clip(lower=0)
    return [below.tolist(), above.tolist()]


def with_n(label: str, n: int) -> str:
    """'MoHGE (n=8)': every study figure names the seeds behind each mean."""
    return f"{label} (n={int(n)})"


def study_rows(df: pd.DataFrame, dataset: str | None) -> tuple[pd.DataFrame, str]:
    """The rows of one dataset (the named one, else the first) of a study table, and that dataset's name."""
    if df.empty or "dataset" not in df:
        return df, dataset or ""
    ds = dataset if dataset in set(df["dataset"]) else str(df["dataset"].iloc[0])
    return df[df["dataset"] == ds], ds


# ---- tables: CSV for machines; Markdown, LaTeX and HTML for readers (make_tables.py and the study scripts) ----
TEX_SYMBOLS = {"±": r"$\pm$", "—": "---", "↓": r"$\downarrow$", "↑": r"$\uparrow$", "Δ": r"$\Delta$", "≥": r"$\geq$"}
TEX_SYMBOLS |= {"<": "$<$", ">": "$>$", "−": "$-$"}  # text-mode < and > print as other glyphs in OT1


def fmt_pm(mean: float, ci: float, digits: int, scale: float = 1.0) -> str:
    if mean != mean:
        return "—"
    ci_text = "—" if ci != ci else f"{ci * scale:,.{digits}f}"
    return f"{mean * scale:,.{digits}f} ± {ci_text}"


def fmt_params(v: float) -> str:
    if v != v or v == 0:
        return "—" if v != v else "0"
    div, unit = param_scale([v])
    x = v / div
    return f"{x:.{2 if x < 10 else 1 if x < 100 else 0}f}{unit}"


def tex(s: str) -> str:
    """Escape LaTeX specials, typeset the symbols, and turn Markdown **bold** into \\textbf."""
    s = re.sub(r"([&%$#_{}])", r"\\\1", s)
    for k, v in TEX_SYMBOLS.items():
        s = s.replace(k, v)
    return re.sub(r"\*\*(.+?)\*\*", r"\\textbf{\1}", s)


def table_key(key: str, prefix: str, ext: str = "") -> bool:
    """Whether an output key names table ``prefix`` ('t1') in format ``ext``: 't1_csv', 'T1_main_csv', ..."""
    key = key.lower()
    return key.startswith(prefix) and not key[len(prefix) : len(prefix) + 1].isdigit() and key.endswith(ext)


def write_table(
    machine, display, outputs: dict, prefix: str, caption: str, left: int = 1, notes=(), by: str = "make_tables.py"
) -> None:
    """The machine table as CSV; the display table (strings) as Markdown, as a booktabs LaTeX tabular and, when an
    ``_html`` output is asked for, as a small HTML page (what `snakemake --report` shows inline), each followed by
    the ``notes`` (Markdown, HTML: lines under the table; LaTeX: full-width rows under the rule)."""
    paths = {
        e: Path(p) for k, p in outputs.items() for e in ("csv", "md", "tex", "html") if table_key(k, prefix, f"_{e}")
    }
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    if "csv" in paths:
        # 12 significant digits: a BLAS or vector unit of another CPU moves a float's last bits, not its first 12
        machine.to_csv(paths["csv"], index=False, float_format="%.12g", lineterminator="\n")
    head, cells = list(display.columns), display.astype(str).values.tolist()
    align = ["l" if i < left else "r" for i in range(len(head))]
    if "md" in paths:
        rows = [head, [":--" if a == "l" else "--:" for a in align], *cells]
        body = [f"| {' | '.join(r)} |" for r in rows] if cells else ["_No data yet._"]
        tail = ["", *(f"- {n}" for n in notes)] if notes else []
        paths["md"].write_text("\n".join([f"**{prefix.upper()}.** {caption}", "", *body, *tail]) + "\n")
    if "html" in paths:
        paths["html"].write_text(html_table(prefix, caption, head, cells, align, notes))
    if "tex" in paths:
        rows = [" & ".join(map(tex, r)) + r" \\" for r in [head, *cells]] if cells else [r"No data yet. \\"]
        width = len(head) if cells else 1
        lines = [f"% {prefix.upper()}: {caption} (written by {by}; do not edit)"]
        lines += [rf"\begin{{tabular}}{{{''.join(align) if cells else 'l'}}}", r"\toprule", rows[0], r"\midrule"]
        foot = [rf"\multicolumn{{{width}}}{{l}}{{\footnotesize {tex(n)}}} \\" for n in notes]
        paths["tex"].write_text("\n".join([*lines, *rows[1:], r"\bottomrule", *foot, r"\end{tabular}"]) + "\n")


def pipe_table(table: pd.DataFrame, caption: str) -> str:
    """A Markdown pipe table under its caption, floats to 4 significant digits."""

    def cell(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    head = list(table.columns)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([caption, "", *lines]) + "\n"


def html_table(prefix: str, caption: str, head: list, cells: list, align: list, notes=()) -> str:
    """One table as a self-contained HTML page: caption, table, notes (every cell escaped)."""

    def esc(text: str) -> str:  # a winner's Markdown bold as <b>
        return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))

    def row(values, tag):
        return (
            "<tr>"
            + "".join(f'<{tag} class="{a}">{esc(str(v))}</{tag}>' for v, a in zip(values, align, strict=True))
            + "</tr>"
        )

    body = [row(head, "th"), *(row(r, "td") for r in cells)] if cells else ["<tr><td>No data yet.</td></tr>"]
    style = (
        "body{font-family:sans-serif;font-size:14px}table{border-collapse:collapse}"
        "th,td{padding:3px 10px;border-bottom:1px solid #ddd}th{border-bottom:2px solid #555}.r{text-align:right}"
    )
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{esc(prefix.upper())}</title>'
        f"<style>{style}</style></head><body>\n<p><b>{esc(prefix.upper())}.</b> {esc(caption)}</p>\n<table>\n"
        + "\n".join(body)
        + "\n</table>\n"
        + (f"<ul>{items}</ul>\n" if notes else "")
        + "</body></html>\n"
    )
