"""The table and figure scripts of workflow/scripts on small synthetic inputs (CPU only, no GPU ever).

Each script's ``main(inputs, outputs, params)`` runs in-process; one runs from the command line and one through
Snakemake's ``script:`` directive. Every figure must be a valid PNG and PDF, byte-identical when rebuilt.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "workflow" / "scripts"
CLAIMS_SCRIPTS = SCRIPTS.parents[1] / "studies" / "claims" / "scripts"  # the claims study's own (study_*.py)
FAMILIES = ("mohge", "moe", "moe_equal", "hmoe", "modse", "dense")
WIDTHS = (384, 512, 640, 768, 896, 1024, 1152, 1280)
T975_2 = 4.302652729749462  # Student t quantile 0.975 on 2 df (scipy.stats.t.ppf)


def rule_params() -> dict[str, dict]:
    """The params the rules give each script that takes values of a study's config, for the claims study
    (studies/claims/config.yaml): read through the typed sections as the rules read them
    (mohge_studies.workflow.settings)."""
    from mohge_studies.config.runs import merge_config
    from mohge_studies.workflow.settings import study_param

    from mohge.config import load_yaml_or_json

    root = SCRIPTS.parents[1]
    claims = merge_config(*map(load_yaml_or_json, (root / "configs/config.yaml", root / "studies/claims/config.yaml")))

    def p(key: str):
        return study_param(claims, key)

    ratio = {"dataset": p("dataset"), "bar": p("balance_bar")}
    return {
        "study_quality": {"dataset": p("dataset"), "metric": p("metric")},
        "study_tests": {"metric": p("metric"), "margin": p("margin")},
        "study_balance": {**ratio, "models": ["mohge", p("reference")], "ep_sizes": p("ep_sizes")}
        | {"decision_ep": p("balance_ep")},
        "study_frontier": {**ratio, "ep": p("balance_ep"), "metric": p("metric")},
        "plot_quality_params": {"metric": p("metric")},
        "make_tables": {"alpha": p("alpha"), "heldout_batches": p("heldout_batches")},
    }


RULE_PARAMS = rule_params()


def load(name: str):
    """A script as a module whose ``main`` gets the params its rule gives it, under those a test passes."""
    path = SCRIPTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(
        f"figscript_{name}", path if path.exists() else CLAIMS_SCRIPTS / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if name in RULE_PARAMS and hasattr(module, "main"):
        main = module.main
        module.main = lambda inputs, outputs, params: main(inputs, outputs, {**RULE_PARAMS[name], **params})
    return module


def write_inputs(d: Path) -> dict[str, Path]:
    """Synthetic results files in the schemas the collect step writes."""
    rnd = random.Random(0)
    runs, curves, groups = [], [], []
    for ds, seeds in (("shakespeare", (0, 1, 2)), ("graded", (0,))):
        for i, fam in enumerate(FAMILIES):
            for seed in seeds:
                run = f"{ds}-{fam}-s{seed}"
                ppl = 8 + i * 0.3 + rnd.random() * 0.2
                runs.append(
                    {
                        "run": run,
                        "dataset": ds,
                        "family": fam,
                        "seed": seed,
                        "total_params": 9e6 - i * 4e5,
                        "activated_params": 3e6 + i * 1e5,
                        "routed_params": 6e6,
                        "val_loss": math.log(ppl),
                        "val_ppl": ppl,
                        "test_loss": math.log(ppl + 0.1),
                        "test_ppl": ppl + 0.1,
                        "tokens_per_s": 1800 - 50 * i + rnd.random() * 20,
                        "train_seconds": 600.0,
                        "task:mohge_cloze:acc": 0.4 + 0.01 * (5 - i) + rnd.random() * 0.01,
                        "activated_params_uniform": 3.2e6 + i * 1e5,
                        "task:mohge_graded_hard:acc": 0.25 + rnd.random() * 0.01,  # at chance: omitted
                        "task:mohge_hellaswag:acc_norm": 0.996,  # at ceiling: omitted
                        "task:mohge_hellaswag:acc": 0.5,  # not the declared metric: never a column
                    }
                )
                start = 100.0 if fam == "mohge" else math.nan
                for step in range(0, 301, 10):
                    loss = 2 + 0.05 * i + 5 * math.exp(-step / 40) + 0.05 * rnd.random()
                    width = 832 + (60 if fam == "mohge" else 20) * (step >= 100) + 10 * rnd.random()
                    curves.append(
                        {
                            "run": run,
                            "dataset": ds,
                            "family": fam,
                            "seed": seed,
                            "step": step,
                            "loss": loss + 0.01,
                            "lm_loss": loss,
                            "group_aux": 0.01,
                            "expert_aux": 0.02,
                            "lr": 1e-3,
                            "val_loss": math.nan,
                            "mean_width": width if fam in ("mohge", "hmoe") else math.nan,
                            "group_aux_start": start,
                            "expert_load": 1.2 + 2 * math.exp(-step / 80) + 0.1 * rnd.random(),
                            "unused_experts": float(max(0, 6 - step // 50)),
                            "rank_flops": 1.05 + 0.3 * math.exp(-step / 80),
                            "rank_flops_ep": 4,
                        }
                    )
                    if step % 100 == 0:
                        curves.append(curves[-1] | {"lm_loss": math.nan, "loss": math.nan, "val_loss": loss + 0.1})
                if fam in ("mohge", "hmoe"):
                    for layer in ("all", 1):
                        for li, level in enumerate(("easy", "medium", "hard", "all")):
                            slots = [10 + (g * li if level != "all" else g) + rnd.randint(0, 3) for g in range(8)]
                            for g, (w, s) in enumerate(zip(WIDTHS, slots, strict=True)):
                                groups.append(
                                    {
                                        "run": run,
                                        "dataset": ds,
                                        "family": fam,
                                        "seed": seed,
                                        "layer": layer,
                                        "level": level,
                                        "group": g,
                                        "width": w,
                                        "slots": s,
                                        "share": s / sum(slots),
                                    }
                                )
    params = []
    for cfg, fam, scale in (
        ("shakespeare-mohge", "mohge", 1e6),
        ("shakespeare-moe", "moe", 1e6),
        ("shakespeare-dense", "dense", 1e6),
        ("preset-mohge-3b", "mohge", 1e8),
        ("preset-moe-3b", "moe", 1e8),
    ):
        routed = 0 if fam == "dense" else (24 if fam == "mohge" else 29.5)
        parts = {
            "embeddings": 2,
            "lm_head": 2,
            "attention": 4,
            "norms": 0.01,
            "routers": 0.1 * bool(routed),
            "routed_experts": routed,
            "shared_experts": 2 * bool(routed),
            "dense_ffn": 1 if routed else 9,
        }
        parts |= {"total": sum(parts.values()), "non_embedding": sum(parts.values()) - 4}
        for comp, v in parts.items():
            act = v * (0.25 if comp in ("routed_experts", "routers") else 1)
            params.append(
                {"config": cfg, "family": fam, "component": comp, "total": v * scale, "activated": act * scale}
            )
    summary, ranks = [], []
    for strategy, skew in (("contiguous", 0.5), ("all_size", 0.02), ("modse_pairs", 0.1), ("flop_lpt", 0.03)):
        for ep in (4, 8, 16):
            for layer in ("all", 1, 2):  # as the collect step writes them: per-rank rows per layer only
                loads = [1 + skew * math.sin(r * 1.7 + ep + (layer == 2)) for r in range(ep)]
                mean = sum(loads) / ep
                for r, v in enumerate(loads if layer != "all" else []):
                    ranks.append(
                        {
                            "source": "shakespeare-mohge-s0",
                            "strategy": strategy,
                            "ep_size": ep,
                            "layer": layer,
                            "rank": r,
                            "flops": v * 1e12,
                            "params": 1e6,
                            "tokens": 1000,
                        }
                    )
                cv = (sum((v - mean) ** 2 for v in loads) / ep) ** 0.5 / mean
                summary.append(
                    {
                        "source": "shakespeare-mohge-s0",
                        "strategy": strategy,
                        "ep_size": ep,
                        "layer": layer,
                        "max_over_mean": max(loads) / mean,
                        "cv": cv,
                        "kind": "analytic",
                    }
                )
                if ep <= 8 and layer == "all":
                    summary.append(summary[-1] | {"kind": "measured", "max_over_mean": max(loads) / mean + 0.05})
    kernels = [
        {"device": dev, "date": "2025-01-02", "T": t, "path": p, "pass": ps_, "ms": 1.0, "tflops": tf * t / (t + 2048)}
        for dev in ("cpu", "NVIDIA H200")
        for t in (256, 1024, 4096, 16384)
        for p, tf in (("triton", 300), ("dense", 400), ("loop", 120), ("torch", 200))
        for ps_ in ("fwd", "fwd+bwd")
    ]
    frames = {"runs": runs, "curves": curves, "groups": groups, "params": params, "summary": summary}
    frames |= {"ranks": ranks, "kernels": kernels, "kernels_cpu": [k for k in kernels if k["device"] == "cpu"]}
    paths = {}
    for name, rows in frames.items():
        paths[name] = d / f"{name}.csv"
        pd.DataFrame(rows).to_csv(paths[name], index=False)
    return paths


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_inputs(tmp_path_factory.mktemp("results"))


FIGURES = {
    "plot_curves": {"curves": "curves"},
    "plot_quality_params": {"runs": "runs"},
    "plot_groups_by_level": {"groups": "groups"},
    "plot_gpu_load": {"ranks": "ranks", "summary": "summary"},
    "plot_width": {"curves": "curves"},
    "plot_load": {"curves": "curves"},
    "plot_kernels": {"kernels": "kernels"},
}


def assert_png_pdf(png: Path, pdf: Path) -> None:
    head = png.read_bytes()
    assert head.startswith(b"\x89PNG\r\n\x1a\n") and head.endswith(b"IEND\xaeB`\x82"), png
    assert b"Software" not in head
    body = pdf.read_bytes()
    assert body.startswith(b"%PDF-") and body.rstrip().endswith(b"%%EOF"), pdf
    assert b"CreationDate" not in body and b"Producer" not in body


@pytest.mark.parametrize("script", sorted(FIGURES))
def test_figure_valid_and_reproducible(script, data, tmp_path):
    main = load(script).main
    inputs = {key: data[name] for key, name in FIGURES[script].items()}
    builds = []
    for i in (1, 2):
        out = {"png": tmp_path / f"{script}-{i}.png", "pdf": tmp_path / f"{script}-{i}.pdf"}
        main(inputs, out, {})
        assert_png_pdf(out["png"], out["pdf"])
        builds.append(out)
    for kind in ("png", "pdf"):
        assert builds[0][kind].read_bytes() == builds[1][kind].read_bytes(), f"{script} {kind} not reproducible"


@pytest.mark.parametrize("script", sorted(FIGURES))
def test_figure_placeholder_without_data(script, tmp_path):
    """Absent or empty inputs (a fresh checkout, a machine without a GPU) still give a valid figure."""
    (tmp_path / "empty.csv").write_text("")
    inputs = {key: tmp_path / ("empty.csv" if i == 0 else "absent.csv") for i, key in enumerate(FIGURES[script])}
    out = {"png": tmp_path / "f.png", "pdf": tmp_path / "f.pdf"}
    load(script).main(inputs, out, {})
    assert_png_pdf(out["png"], out["pdf"])


def test_kernels_cpu_rows_give_placeholder(data, tmp_path):
    out = {"png": tmp_path / "cpu.png", "pdf": tmp_path / "cpu.pdf"}
    load("plot_kernels").main({"kernels": data["kernels_cpu"]}, out, {})
    assert_png_pdf(out["png"], out["pdf"])
    none = {"png": tmp_path / "none.png", "pdf": tmp_path / "none.pdf"}
    load("plot_kernels").main({"kernels": tmp_path / "absent.csv"}, none, {})
    assert out["png"].read_bytes() == none["png"].read_bytes()  # the same "no GPU benchmark recorded yet" figure


def test_command_line_matches_in_process(data, tmp_path):
    """The argparse entry gives the same bytes as main() in this process (a fresh interpreter, same figure)."""
    main = load("plot_gpu_load").main
    main(
        {"ranks": data["ranks"], "summary": data["summary"]}, {"png": tmp_path / "a.png", "pdf": tmp_path / "a.pdf"}, {}
    )
    cmd = [sys.executable, SCRIPTS / "plot_gpu_load.py", "--in", f"ranks={data['ranks']}"]
    cmd += [
        "--in",
        f"summary={data['summary']}",
        "--out",
        f"png={tmp_path / 'b.png'}",
        "--out",
        f"pdf={tmp_path / 'b.pdf'}",
    ]
    subprocess.run(cmd, check=True)
    for kind in ("png", "pdf"):
        assert (tmp_path / f"a.{kind}").read_bytes() == (tmp_path / f"b.{kind}").read_bytes()


def test_mean_ci_is_the_student_t_half_width_over_the_values_present():
    import mohge_studies.analysis.plotstyle as ps

    mean, hw, n = ps.mean_ci([1, 2, 3])
    assert (mean, n) == (2.0, 3) and hw == pytest.approx(T975_2 / math.sqrt(3), rel=1e-12)
    one = ps.mean_ci([5.0])
    assert one[0] == 5.0 and math.isnan(one[1]) and one[2] == 1
    assert ps.mean_ci([2.0, float("nan"), 4.0])[2] == 2


def make_tables(inputs: dict, tmp_path: Path, params: dict | None = None) -> dict[str, Path]:
    names = {1: "T1_main", 2: "T2_params", 3: "T3_balance"}  # the keys of the tables rule in analysis.smk
    outs = {f"{names[i]}_{k}": tmp_path / f"T{i}.{k}" for i in (1, 2, 3) for k in ("csv", "md", "tex", "html")}
    load("make_tables").main(inputs, outs, {"task_docs": 200, **(params or {})})
    return {f"t{k[1]}_{k.rsplit('_', 1)[1]}": v for k, v in outs.items()}


def test_tables(data, tmp_path):
    runs = pd.read_csv(data["runs"])
    known = runs["dataset"].eq("shakespeare") & runs["family"].eq("moe")
    runs.loc[known, "val_ppl"] = [1.0, 2.0, 3.0]
    runs.to_csv(tmp_path / "runs.csv", index=False)
    inputs = {"runs": tmp_path / "runs.csv", "params": data["params"], "util": data["summary"]}
    outs = make_tables(inputs, tmp_path)
    t1 = pd.read_csv(outs["t1_csv"])
    row = t1[(t1["dataset"] == "shakespeare") & (t1["family"] == "moe")].iloc[0]
    assert row["n_seeds"] == 3 and row["val_ppl_mean"] == pytest.approx(2.0)
    assert row["val_ppl_ci95"] == pytest.approx(T975_2 / math.sqrt(3), rel=1e-12)
    assert list(t1[t1["dataset"] == "shakespeare"]["family"]) == list(FAMILIES)
    assert t1[t1["dataset"] == "graded"]["val_ppl_ci95"].isna().all()  # one seed: no interval
    md, tex = outs["t1_md"].read_text(), outs["t1_tex"].read_text()
    # the lowest mean wins: its CI (-0.48..4.48) lies below every other row's (about 8 to 10)
    assert "**2.00 ± 2.48**" in md and r"\textbf{2.00 $\pm$ 2.48}" in tex
    assert "± —" in md and r"$\pm$ ---" in tex and r"\begin{tabular}" in tex and "cloze acc (%)" in md
    for head in ("Val PPL (full split)", "Activated (learned routing)", "Activated (uniform routing)"):
        assert head in md, head
    assert "hellaswag acc " not in md and "graded_hard" not in md.split("\n\n")[1]  # omitted columns
    assert "Omitted task mohge_graded_hard (acc): not reported: at chance" in md
    assert "Omitted task mohge_hellaswag (acc_norm): not reported: at ceiling" in md
    assert r"\multicolumn" in tex and "at ceiling" in tex
    page = outs["t1_html"].read_text()  # what --report shows inline: the same cells, escaped, and the notes
    assert page.startswith("<!DOCTYPE html>") and "<th" in page and "**" not in page and "<b>2.00 ± 2.48</b>" in page
    assert "Val PPL (full split)" in page and "at ceiling" in page and page.count("<tr>") == md.count("\n| ") - 1
    t2md = outs["t2_md"].read_text()
    head = next(line for line in t2md.splitlines() if line.startswith("| Model"))
    assert head.count("|") - 1 == 2 + 10 and "| routed experts |" in head  # model, count, a column a component
    assert "| shakespeare-mohge | activated (uniform routing) |" in t2md
    t2 = pd.read_csv(outs["t2_csv"]).set_index(["model", "count"])
    diff = t2.loc[("mohge_vs_moe:shakespeare", "total_rel_diff_pct"), "routed_experts"]
    assert diff == pytest.approx((24 - 29.5) / 29.5 * 100)
    assert "| MoHGE vs MoE (preset-3b) | total, Δ |" in t2md
    t3 = pd.read_csv(outs["t3_csv"])
    assert {"analytic_max_over_mean_mean", "analytic_n", "measured_max_over_mean_ci95"} <= set(t3.columns)
    assert t3["strategy"].iloc[0] == "contiguous" and (t3["analytic_n"] == 1).all()
    assert not any("**" in line for line in outs["t3_md"].read_text().splitlines() if line.startswith("|"))
    for k, path in outs.items():
        assert path.stat().st_size > 0, k


def test_tables_bold_only_test_winners(data, tmp_path):
    """A clearly best multi-seed row is bold; a better single-seed row never is, and it blocks no winner."""
    runs = pd.read_csv(data["runs"])
    sh = runs["dataset"].eq("shakespeare")
    runs.loc[sh & runs["family"].eq("mohge"), "test_ppl"] = [5.0, 5.1, 5.2]  # n = 3, CI far below the rest
    runs.loc[runs["dataset"].eq("graded") & runs["family"].eq("dense"), "test_ppl"] = 1.0  # n = 1, lowest
    runs.loc[sh & runs["family"].eq("moe"), "val_ppl"] = [1.0, 8.0, 15.0]  # lowest mean, CI overlaps: no winner
    runs.to_csv(tmp_path / "runs.csv", index=False)
    md = make_tables({"runs": tmp_path / "runs.csv"}, tmp_path)["t1_md"].read_text()
    bold = [line for line in md.splitlines() if "**" in line and line.startswith("|")]
    assert len(bold) == 1 and bold[0].startswith("| shakespeare | MoHGE | 3 |") and "**5.10 ± 0.25**" in bold[0]
    assert not any(line.startswith("| graded") and "**" in line for line in md.splitlines())
    first = make_tables({"runs": tmp_path / "runs.csv"}, tmp_path / "again")
    assert first["t1_md"].read_bytes() == md.encode()  # a rerun is byte-identical


def test_t1_names_the_part_of_the_splits_its_perplexities_read(data, tmp_path):
    """H0 'T1 says "full split" whatever its study's evaluations read' fails: with the study's eval.heldout_batches at
    16 its caption and perplexity columns name the first 16 batches; at 0 (the whole splits) they say full."""
    (tmp_path / "part").mkdir()
    part = make_tables({"runs": data["runs"]}, tmp_path / "part", {"heldout_batches": 16})["t1_md"].read_text()
    whole = make_tables({"runs": data["runs"]}, tmp_path, {"heldout_batches": 0})["t1_md"].read_text()
    assert "perplexity on the full val and test splits." in whole and "| Val PPL (full split) ↓ |" in whole
    assert "perplexity on the first 16 evaluation batches of the val and test splits." in part
    assert "| Test PPL (first 16 batches) ↓ |" in part and "full split" not in part


def test_tables_pool_traces_over_seeds(data, tmp_path):
    """T3 pools the traces of every seed of the named trace's model: n and a CI per cell."""
    u = pd.read_csv(data["summary"])
    u = pd.concat([u, u.assign(source=u["source"].str.replace("-s0", "-s1"), max_over_mean=u["max_over_mean"] + 0.01)])
    u.to_csv(tmp_path / "u.csv", index=False)
    outs = make_tables({"util": tmp_path / "u.csv"}, tmp_path, {"source": "shakespeare-mohge-s0"})
    t3 = pd.read_csv(outs["t3_csv"])
    assert (t3["analytic_n"] == 2).all() and t3["analytic_max_over_mean_ci95"].notna().all()
    assert "n ≥ 2 traces" in outs["t3_md"].read_text()


def test_tables_without_rows(tmp_path):
    (tmp_path / "runs.csv").write_text("run,dataset,family,seed,val_ppl\n")
    outs = {k: tmp_path / f"T1.{k[3:]}" for k in ("t1_csv", "t1_md", "t1_tex")}
    load("make_tables").main({"runs": tmp_path / "runs.csv"}, outs, {})
    assert "No data yet" in outs["t1_md"].read_text() and r"\end{tabular}" in outs["t1_tex"].read_text()


def test_snakemake_script_directive(data, tmp_path):
    """The scripts run under Snakemake's script: directive (snakemake object, the package import, log redirect)."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(
        f"""
rule all:
    input:
        "out/F4.png",
        "out/T3.md",


rule f4:
    input:
        ranks="{data["ranks"]}",
        summary="{data["summary"]}",
    output:
        png="out/F4.png",
        pdf="out/F4.pdf",
    params:
        source="shakespeare-mohge-s0",
    log:
        "logs/f4.log",
    script:
        "{SCRIPTS / "plot_gpu_load.py"}"


rule t3:
    input:
        utilization="{data["summary"]}",
    output:
        t3_csv="out/T3.csv",
        t3_md="out/T3.md",
        t3_tex="out/T3.tex",
    log:
        "logs/t3.log",
    script:
        "{SCRIPTS / "make_tables.py"}"
"""
    )
    cmd = [sys.executable, "-m", "snakemake", "-s", snakefile, "--cores", "1", "-d", tmp_path, "--quiet"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_png_pdf(tmp_path / "out/F4.png", tmp_path / "out/F4.pdf")
    assert (tmp_path / "logs/f4.log").exists() and "max/mean" in (tmp_path / "out/T3.md").read_text()


# ---- the claims study's figures (studies/claims/scripts/study_*.py) on tables made by mohge_studies.claims.analysis --
STUDY_MODELS = {  # model: (seeds, total params, mean test ppl)
    "mohge": (8, 8.96e6, 80.0),
    "moe": (8, 10.7e6, 80.5),
    "moe_equal": (8, 8.96e6, 82.0),
    "moe+w160": (3, 7.2e6, 85.0),
    "moe+w320": (3, 12.5e6, 78.0),
    "dense": (3, 2.46e6, 86.0),
    "mohge+ae5e2": (3, 8.96e6, 80.8),
    "mohge+ae2e1": (3, 8.96e6, 83.0),
}
GRADED_MODELS = {"mohge+ag1e5": 30.0, "mohge+ag1e4": 30.3, "mohge+ag1e3": 31.0}


def write_study(d: Path) -> dict[str, Path]:
    """A synthetic study (studies/claims/config.yaml's models and seeds) collected and analysed by the claims analysis
    (mohge_studies.claims.analysis)."""
    from mohge_studies.claims import analysis as study

    rnd = random.Random(1)
    runs, util, groups = [], [], []
    models = [("shakespeare", m, *v) for m, v in STUDY_MODELS.items()]
    models += [("graded", m, 3, 8.57e6, p) for m, p in GRADED_MODELS.items()]
    for ds, model, seeds, total, ppl in models:
        for seed in range(seeds):
            run = f"{ds}-{model.replace('+', '-')}-s{seed}"
            routed = total * 0.85 if model != "dense" else 0
            test = ppl * (1 + 0.01 * rnd.gauss(0, 1)) + 0.5 * seed
            runs.append(
                {
                    "run": run,
                    "dataset": ds,
                    "family": model,
                    "seed": seed,
                    "total_params": total,
                    "activated_params": 2.2e6 + rnd.random() * 1e4 - 1e5 * ("ag1e3" in model),
                    "activated_params_uniform": 2.25e6,
                    "routed_params": routed,
                    "val_ppl": test * 1.05,
                    "test_ppl": test,
                }
            )
            ae = {"mohge": 0.0, "mohge+ae5e2": 0.15, "mohge+ae2e1": 0.3}.get(model)
            if model.startswith("mohge") or model == "moe":
                for strategy, base in (
                    ("contiguous", 1.3),
                    ("all_size", 1.35),
                    ("modse_pairs", 1.2),
                    ("flop_lpt", 1.02),
                ):
                    if model == "moe" and strategy in ("all_size", "modse_pairs"):
                        continue
                    for ep in (2, 4, 8):
                        v = 1 + (base - 1) * ep / 4 * (1 - (ae or 0)) + 0.03 * rnd.random()
                        util.append(
                            {
                                "source": run,
                                "strategy": strategy,
                                "ep_size": ep,
                                "layer": "all",
                                "max_over_mean": v,
                                "cv": v - 1,
                                "kind": "analytic",
                            }
                        )
            if ds == "graded":
                shift = {"mohge+ag1e5": 0, "mohge+ag1e4": 8, "mohge+ag1e3": 25}[model]
                for level, lw in (("easy", -1), ("medium", 0), ("hard", 1)):
                    for g, w in enumerate((96, 160, 256, 320)):
                        slots = 100 + int(lw * shift * (g - 1.5)) + rnd.randint(0, 5)
                        groups.append(
                            {
                                "run": run,
                                "dataset": ds,
                                "family": model,
                                "seed": seed,
                                "layer": "all",
                                "level": level,
                                "group": g,
                                "width": w,
                                "slots": slots,
                                "share": 0.25,
                            }
                        )
    runs_df, util_df, groups_df = pd.DataFrame(runs), pd.DataFrame(util), pd.DataFrame(groups)
    analysis = {"alpha": 0.05, "equivalence_margin": 0.03, "primary_metric": "test_ppl"}
    sh = runs_df[runs_df["dataset"] == "shakespeare"]
    tables = {
        "s1": study.model_summary(runs_df),
        "s2": study.quality_tests(sh, analysis),
        "s3": study.balance(util_df, runs_df),
        "s4": study.difficulty(groups_df, runs_df),
    }
    paths = {}
    for key, df in tables.items():
        paths[key] = d / f"{key.upper()}.csv"
        df.to_csv(paths[key], index=False)
    return paths


STUDY_FIGURES = {  # script: its inputs (keys of write_study / of the study tables of the default results)
    "study_quality": ("s1",),
    "study_tests": ("s2",),
    "study_balance": ("s3",),
    "study_frontier": ("s1", "s3"),
    "study_difficulty": ("s4",),
}
DEFAULT_RESULTS = Path(__file__).resolve().parents[2] / "results" / "default"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict[str, Path]:
    return write_study(tmp_path_factory.mktemp("study"))


@pytest.fixture(scope="module")
def default_study(tmp_path_factory) -> dict[str, Path]:
    """The study tables of the committed default-config results (few models, mostly one seed)."""
    from mohge_studies.claims import analysis as study

    out = tmp_path_factory.mktemp("default_study")
    config = Path(__file__).resolve().parents[2] / "configs" / "config.yaml"
    assert study.main(["--results", str(DEFAULT_RESULTS), "--config", str(config), "--out", str(out)]) == 0
    names = {"s1": "S1_models", "s2": "S2_tests", "s3": "S3_balance", "s4": "S4_difficulty"}
    return {k: out / f"{v}.csv" for k, v in names.items()}


def build_twice(script: str, inputs: dict, tmp_path: Path, params: dict | None = None) -> Path:
    """Run a figure script twice; both builds valid and byte-identical; returns the PNG of the first."""
    builds = []
    for i in (1, 2):
        out = {"png": tmp_path / f"{script}-{i}.png", "pdf": tmp_path / f"{script}-{i}.pdf"}
        load(script).main(inputs, out, params or {})
        assert_png_pdf(out["png"], out["pdf"])
        builds.append(out)
    for kind in ("png", "pdf"):
        assert builds[0][kind].read_bytes() == builds[1][kind].read_bytes(), f"{script} {kind} not reproducible"
    return builds[0]["png"]


def figure_texts(script: str, inputs: dict, monkeypatch, axes: list | None = None) -> list[str]:
    """Every text drawn by a figure script (titles, labels, legends, annotations), captured before saving;
    the (title, ylim) of each axes go to ``axes`` when given."""
    import mohge_studies.analysis.plotstyle as ps

    texts: list[str] = []

    def capture(fig, png, pdf):
        texts.extend(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
        if axes is not None:
            axes.extend((ax.get_title(), ax.get_ylim()) for ax in fig.axes)
        ps.plt.close(fig)

    module = load(script)
    with monkeypatch.context() as m:  # plotstyle is one module shared by every script: undo at once
        m.setattr(module.ps, "save", capture)
        module.main(inputs, {}, {})
    return texts


@pytest.mark.parametrize("script", sorted(STUDY_FIGURES))
def test_study_figure(script, study, default_study, tmp_path, monkeypatch):
    """On a full synthetic study: valid, byte-identical on a rerun, n and 95% CI stated. On the default config's
    tables (most study models absent, mostly one seed) and on empty tables: a valid figure, no failure."""
    inputs = {k: study[k] for k in STUDY_FIGURES[script]}
    build_twice(script, inputs, tmp_path)
    texts = " ".join(figure_texts(script, inputs, monkeypatch))
    assert "95% CI" in texts and re.search(r"n ?= ?\d", texts), texts  # every figure states n and its CI
    assert "placeholder" not in texts.lower() and "no α_G sweep" not in texts
    (tmp_path / "empty.csv").write_text("")
    for name, tables in (("default", default_study), ("empty", dict.fromkeys(study, tmp_path / "empty.csv"))):
        out = {"png": tmp_path / f"{name}.png", "pdf": tmp_path / f"{name}.pdf"}
        load(script).main({k: tables[k] for k in STUDY_FIGURES[script]}, out, {})
        assert_png_pdf(out["png"], out["pdf"])


def test_study_figures_show_what_they_claim(study, monkeypatch):
    """F8 annotates each test's p and decision; F7 gives every model's n; F9 has a panel per trace kind."""
    f8 = " ".join(figure_texts("study_tests", {"s2": study["s2"]}, monkeypatch))
    s2 = pd.read_csv(study["s2"]).query("metric == 'test_ppl'")
    for r in s2.itertuples():
        assert f"n={r.n}" in f8 and r.decision in f8
    assert "equivalence\nband ±3%" in f8 and "p = 0.005" in f8
    f7 = figure_texts("study_quality", {"s1": study["s1"]}, monkeypatch)
    assert "MoHGE (n=8)" in f7 and "MoE [w160] (width sweep) (n=3)" in f7
    s3 = pd.read_csv(study["s3"])
    both = pd.concat([s3.assign(trace="trained"), s3.assign(trace="even_within_groups")])
    both.to_csv(study["s3"].with_name("S3_traces.csv"), index=False)
    f9 = figure_texts("study_balance", {"s3": study["s3"].with_name("S3_traces.csv")}, monkeypatch)
    assert "routing of the trained models" in f9 and "synthetic: each group's load" in " ".join(f9)
    assert not any("_within_" in t for t in f9)  # no raw identifier as a panel title
    assert "Q2 bar 1.1 (read at EP 4)" in f9  # the declared bar is drawn
    f11 = " ".join(figure_texts("study_difficulty", {"s4": study["s4"]}, monkeypatch))
    # short alpha_G ticks, and n once in the title when every point has the same n
    assert "1e-3" in f11 and "(n = 3 seeds each)" in f11 and "α_G (Group-Wise loss coefficient)" in f11
    assert "paired easy − hard" in f11 and "saving" not in f11


def test_f12_draws_the_control_arms_paired_tests(tmp_path, monkeypatch):
    """F12 from S8: every paired test of a control arm with its n, p and decision, readable arm labels (no raw
    variant tag, no nan), no equivalence band; the selection and rule rows are not drawn; an arm not run is
    listed as such."""
    from mohge_studies.claims import controls
    from mohge_studies.config.runs import merge_config

    from mohge.config import load_yaml_or_json

    root = Path(__file__).resolve().parents[2]
    config = merge_config(*map(load_yaml_or_json, (root / "configs/config.yaml", root / "studies/claims/config.yaml")))
    rnd = random.Random(2)
    runs = []
    for fam, ppl in (("mohge", 71.5), ("moe_equal", 74.5), ("mohge+hom208", 73.0), ("moe_equal+noaux", 74.0)):
        for seed in range(4):
            ppl_s = ppl * (1 + 0.01 * seed) + rnd.gauss(0, 0.3)
            runs.append({"dataset": "shakespeare", "family": fam, "seed": seed, "test_ppl": ppl_s})
    s8 = controls.control_tests(pd.DataFrame(runs), config)
    s8.to_csv(tmp_path / "S8.csv", index=False)
    texts = figure_texts("study_tests", {"s8": tmp_path / "S8.csv"}, monkeypatch)
    joined = " ".join(texts)
    ran = s8[s8["test"].isin(["two-sided", "less"]) & s8["ratio"].notna()]
    assert len(ran) >= 3
    for r in ran.itertuples():
        assert f"n={int(r.n)}" in joined and r.decision in joined
    assert "(a) MoHGE / MoHGE, all widths 208" in texts and "declared, not run" in joined
    assert "nan" not in joined and "hom208" not in joined.replace("all widths 208", "") and "equivalence" not in joined
    assert "Q1b restated" not in joined and "best lr: mohge" not in joined
    build_twice("study_tests", {"s8": tmp_path / "S8.csv"}, tmp_path)


def test_figures_state_n(data, monkeypatch):
    """F2 and F3 name n; F3 never claims a mean over seeds at n = 1."""
    runs = pd.read_csv(data["runs"])
    graded = runs["dataset"] == "graded"
    runs.loc[graded, "test_ppl"] = 11.52 + 0.0001 * runs.loc[graded].index  # models 0.01 ppl apart
    runs.to_csv(data["runs"].with_name("runs_close.csv"), index=False)
    axes: list = []
    f2 = " ".join(
        figure_texts("plot_quality_params", {"runs": data["runs"].with_name("runs_close.csv")}, monkeypatch, axes)
    )
    lo, hi = next(ylim for title, ylim in axes if title.startswith("graded"))
    assert hi - lo >= 0.04 * 11.52 * 0.999 and "all means within" in f2  # no axis spanning 0.01 ppl
    assert "(n=3)" in f2 and "(n=1)" in f2 and "95% CI" in f2 and "full test split" in f2  # the primary endpoint
    groups = pd.read_csv(data["groups"])
    one = data["groups"].with_name("groups_one_seed.csv")
    groups[groups["seed"] == 0].to_csv(one, index=False)
    f3 = " ".join(figure_texts("plot_groups_by_level", {"groups": one}, monkeypatch))
    assert "n = 1" in f3 and "mean over" not in f3
    f3_many = " ".join(figure_texts("plot_groups_by_level", {"groups": data["groups"]}, monkeypatch))
    assert "n = 3 seeds" in f3_many and "95% CI" in f3_many


def test_study_tables_tex(study, default_study, tmp_path):
    """S1-S4 as LaTeX: n on every row, CIs as [low, high], nothing bold, symbols typeset; reruns identical."""
    for name, tables in (("full", study), ("default", default_study)):
        outs = {f"s{i}_tex": tmp_path / name / f"S{i}.tex" for i in (1, 2, 3, 4)}
        outs |= {"s2_md": tmp_path / name / "S2.md"}
        load("study_tables").main(tables, outs, {})
        first = {k: p.read_bytes() for k, p in outs.items()}
        load("study_tables").main(tables, outs, {})
        assert first == {k: p.read_bytes() for k, p in outs.items()}, name
        for key, path in outs.items():
            text = path.read_text()
            assert "textbf" not in text and "**" not in text.split("\n", 1)[1], key
            if key.endswith("tex"):
                assert r"\begin{tabular}" in text and r"\end{tabular}" in text and "<" not in text.replace("$<$", "")
    s2 = (tmp_path / "full" / "S2.md").read_text()
    assert "| Q1 parity | Test PPL (full split) | MoHGE / MoE | tost | before | 8 | 0.988 [0.976, 1.000] |" in s2
    assert "| Q1 non-inferiority | Test PPL (full split) | MoHGE / MoE | noninferiority | after (post hoc) | 8 |" in s2
    assert "(ratio 1) |" in s2  # the power of TOST and non-inferiority is read at a true ratio of 1
    s1 = (tmp_path / "full" / "S1.tex").read_text()
    assert "Activated (learned routing)" in s1 and "Activated (uniform routing)" in s1 and "& 8 &" in s1
    assert "n $<$ 2" in (tmp_path / "default" / "S2.tex").read_text()


def test_study_controls_tex(tmp_path):
    """S8 (the controls declared after the results) as LaTeX from the committed claims study, where every arm has
    run: each row with its status (run, or declared, not run) and no nan (a dash where a row has no number), the
    restated Q1b last; a rerun is identical."""
    from mohge_studies.claims import controls
    from mohge_studies.config.runs import merge_config

    from mohge.config import load_yaml_or_json

    root = Path(__file__).resolve().parents[2]
    config = merge_config(*map(load_yaml_or_json, (root / "configs/config.yaml", root / "studies/claims/config.yaml")))
    s8 = controls.control_tests(pd.read_csv(root / "results" / "claims" / "runs.csv"), config)
    s8.to_csv(tmp_path / "S8.csv", index=False)
    outs = {"s8_tex": tmp_path / "S8.tex", "s8_md": tmp_path / "S8.md"}
    load("study_tables").main({"s8": tmp_path / "S8.csv"}, outs, {})
    first = outs["s8_tex"].read_bytes()
    load("study_tables").main({"s8": tmp_path / "S8.csv"}, outs, {})
    assert outs["s8_tex"].read_bytes() == first
    tex, md = outs["s8_tex"].read_text(), outs["s8_md"].read_text()
    assert r"\begin{tabular}" in tex and "nan" not in tex and "nan" not in md
    rows = [r for r in md.splitlines() if r.startswith("| (") or r.startswith("| Q1b")]
    ran = set(s8.loc[s8["status"] == "run", "question"])
    assert len(rows) == 10 and all(("| run |" in r) == any(f"| {q} |" in r for q in ran) for r in rows)
    assert len(ran) == 10  # all 41 arms are committed
    assert rows[-1].startswith("| Q1b restated | heterogeneity helps? |") and "the package" in rows[-1]


def test_load_figure_draws_the_logged_load_and_leaves_out_runs_without_it(data, tmp_path, monkeypatch):
    """F14 draws one panel per load column and dataset from the rows that hold load columns; a curves.csv without
    them gives the placeholder that says so."""
    import pandas as pd

    curves = pd.read_csv(data["curves"])
    drawn = []
    plotstyle = load("plot_load").ps
    monkeypatch.setattr(plotstyle, "curve_panel", lambda ax, d, col, *a: drawn.append((col, len(d))) or [])
    out = {"png": tmp_path / "a.png", "pdf": tmp_path / "a.pdf"}
    load("plot_load").main({"curves": data["curves"]}, out, {})
    datasets = curves.dropna(subset=["expert_load"])["dataset"].nunique()
    assert [c for c, _ in drawn] == ["expert_load", "unused_experts", "rank_flops"] * datasets
    placeholders = []
    monkeypatch.setattr(plotstyle, "placeholder_figure", lambda o, title, msg: placeholders.append(msg))
    bare = tmp_path / "bare.csv"
    curves.drop(columns=["expert_load", "unused_experts", "rank_flops"]).to_csv(bare, index=False)
    load("plot_load").main({"curves": bare}, out, {})
    assert placeholders == ["these runs' logs hold no load columns"]


def idle_logs(d: Path) -> dict:
    """Training logs of MoHGE (two seeds, 8 width classes) and a homogeneous MoE (one class) on two datasets, and the
    runs.csv that names them, as the idle figure's rule gives them."""
    runs = []
    for ds in ("shakespeare", "graded"):
        for fam, seeds in (("mohge", (0, 1)), ("moe", (0,)), ("dense", (0,))):
            for seed in seeds:
                run = f"{ds}-{fam}-s{seed}"
                runs.append({"run": run, "dataset": ds, "family": fam, "seed": seed})
                rows = []
                for step in range(9, 400, 10):
                    classes = [1 / 8] * 8 if fam == "mohge" else [1.0]
                    if fam == "mohge" and step < 60:
                        classes = [0.0] + [1 / 7] * 7
                    if fam != "dense":
                        idle = max(0, 12 - step // 20) if fam == "mohge" else int(step < 30)
                        rows.append({"step": step, "unused_experts": [idle, idle // 2], "group_usage": [classes] * 2})
                    else:
                        rows.append({"step": step, "loss": 3.0})
                (d / "runs" / run).mkdir(parents=True)
                (d / "runs" / run / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(runs).to_csv(d / "runs.csv", index=False)
    return {"runs": d / "runs.csv", "logs": sorted(str(p) for p in d.glob("runs/*/train_log.jsonl"))}


def test_idle_figure_builds_from_training_logs_and_rebuilds_byte_identical(tmp_path, monkeypatch):
    """F15 draws, per dataset, unused experts and (where a model has two width classes or more) unused classes for
    each model whose logs count them; rebuilt, the same bytes; without logs, the placeholder that says so."""
    inputs = idle_logs(tmp_path)
    builds = []
    for i in (1, 2):
        out = {"png": tmp_path / f"f{i}.png", "pdf": tmp_path / f"f{i}.pdf"}
        load("plot_idle").main(inputs, out, {})
        assert_png_pdf(out["png"], out["pdf"])
        builds.append(out)
    for kind in ("png", "pdf"):
        assert builds[0][kind].read_bytes() == builds[1][kind].read_bytes()
    module = load("plot_idle")
    drawn = []
    real_plot = module.plt.Axes.plot
    monkeypatch.setattr(module.plt.Axes, "plot", lambda ax, *a, **k: drawn.append(ax) or real_plot(ax, *a, **k))
    module.main(inputs, {"png": tmp_path / "g.png"}, {})
    # per dataset: mohge and moe in the experts panel, mohge alone in the classes panel; dense is named, not drawn
    labels = [ax.get_ylabel() for ax in drawn]
    assert sum("experts" in y for y in labels) == 4 and sum("classes" in y for y in labels) == 2
    placeholders = []
    monkeypatch.setattr(module.ps, "placeholder_figure", lambda o, title, msg: placeholders.append(msg))
    module.main({"runs": inputs["runs"], "logs": []}, {"png": tmp_path / "h.png"}, {})
    assert placeholders == ["these runs' logs hold no routing counts"]


def test_inference_figure_draws_a_line_per_knob_with_intervals_over_runs(tmp_path):
    """F13's points are per (model, served routing) means with a 95 % half-width over runs; a served point belongs to
    the knob its keys name."""
    mod = load("plot_inference")
    assert [mod.knob(p) for p in ("trained", "topk=1", "group_topk=2,topk=2", "bar_widest=4")] == [
        "", "topk", "group_topk,topk", "bar_widest"]  # fmt: skip
    assert mod.short("group_topk=2,topk=2") == "Kg=2,K=2" and mod.short("trained") == ""
    rows = [{"dataset": "d", "family": "mohge", "run": f"d-mohge-s{s}", "point": p, "val_ppl": v + s,
             "flops_per_token": f, "n_tokens": 64} for s in range(3)
            for p, v, f in (("trained", 10.0, 4e6), ("topk=1", 12.0, 2e6))]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "inference.csv", index=False)
    t = mod.summarise(pd.read_csv(tmp_path / "inference.csv")).set_index("point")
    assert t.loc["trained", "val_ppl"] == 11.0 and t.loc["trained", "n"] == 3
    assert t.loc["topk=1", "hw"] == pytest.approx(T975_2 * 1.0 / math.sqrt(3))
    mod.main({"rows": tmp_path / "inference.csv"}, {"png": tmp_path / "f.png"}, {})
    assert (tmp_path / "f.png").stat().st_size > 0
