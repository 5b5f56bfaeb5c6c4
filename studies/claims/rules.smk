# The claims study's declared analysis (studies/claims; docs/study.md) and its tables S1-S11 and figures F7-F12, for
# every study whose config declares `analysis.design: claims`. Like the other tables and figures, they read only the
# study's collected CSVs and its committed per-run routing traces, so `figures` redraws them with no training job.
# Paths of scripts, captions and conda envs are relative to this file.
from mohge_studies import claims


rule study_analysis:
    # Paired tests (TOST, one-sided, width sweep), balance over seeds and by difficulty (mohge_studies.claims.analysis).
    input:
        runs="results/{study}/runs.csv",
        util="results/{study}/utilization_summary.csv",
        groups="results/{study}/groups_by_level.csv",
        traces=study_traces,
    output:
        # the HTML tables go into `snakemake --report` (category Study tables), shown inline
        **{
            f"{t}_{ext}": (
                report(
                    f"results/{{study}}/study/{t}.{ext}",
                    caption="captions/study_tables.rst",
                    category="Study tables",
                )
                if ext == "html"
                else f"results/{{study}}/study/{t}.{ext}"
            )
            for t in claims.TABLES
            for ext in ["csv", "md", "html"]
        },
    log:
        "logs/{study}/study_analysis.log",
    localrule: True
    conda:
        "../../workflow/envs/train.yaml"
    params:
        # canonical JSON: the merged config compared as data, so the order of its keys (a --configfile run
        # against the figures target's merge) does not rerun the job
        cfg=lambda wc: json.dumps(PLAN.study_config(wc.study), sort_keys=True),
    script:
        "scripts/study_analysis.py"


rule study_tables_tex:
    # keys s1 .. s4, s8: the table's number (scripts/study_tables.py builds each)
    input:
        **{
            t.split("_")[0].lower(): f"results/{{study}}/study/{t}.csv"
            for t in claims.TEX_TABLES
        },
    output:
        **{
            f"{t.split('_')[0].lower()}_tex": f"results/{{study}}/study/{t}.tex"
            for t in claims.TEX_TABLES
        },
    log:
        "logs/{study}/study_tables_tex.log",
    localrule: True
    conda:
        "../../workflow/envs/train.yaml"  # make_tables imports mohge_studies.claims.analysis (scipy)
    script:
        "scripts/study_tables.py"


rule fig_study_quality:
    input:
        s1="results/{study}/study/S1_models.csv",
    output:
        png=report(
            "figures/{study}/F7_study_quality.png",
            caption="captions/F7_study_quality.rst",
            category="Study",
        ),
        pdf="figures/{study}/F7_study_quality.pdf",
    log:
        "logs/{study}/figures/F7.log",
    localrule: True
    conda:
        "../../workflow/envs/plot.yaml"
    params:
        dataset=lambda wc: study_param(wc.study, "dataset"),
        metric=lambda wc: study_param(wc.study, "metric"),
    script:
        "scripts/study_quality.py"


rule fig_study_tests:
    input:
        s2="results/{study}/study/S2_tests.csv",
    output:
        png=report(
            "figures/{study}/F8_study_tests.png",
            caption="captions/F8_study_tests.rst",
            category="Study",
        ),
        pdf="figures/{study}/F8_study_tests.pdf",
    log:
        "logs/{study}/figures/F8.log",
    localrule: True
    conda:
        "../../workflow/envs/plot.yaml"
    params:
        metric=lambda wc: study_param(wc.study, "metric"),
        margin=lambda wc: study_param(wc.study, "margin"),
    script:
        "scripts/study_tests.py"


rule fig_study_controls:
    input:
        s8="results/{study}/study/S8_controls.csv",
    output:
        png=report(
            "figures/{study}/F12_study_controls.png",
            caption="captions/F12_study_controls.rst",
            category="Study",
        ),
        pdf="figures/{study}/F12_study_controls.pdf",
    log:
        "logs/{study}/figures/F12.log",
    localrule: True
    conda:
        "../../workflow/envs/plot.yaml"
    params:
        metric=lambda wc: study_param(wc.study, "metric"),
        margin=lambda wc: study_param(wc.study, "margin"),  # the x-axis spans at least the margin
    script:
        "scripts/study_tests.py"


rule fig_study_balance:
    input:
        s3="results/{study}/study/S3_balance.csv",
    output:
        png=report(
            "figures/{study}/F9_study_balance.png",
            caption="captions/F9_study_balance.rst",
            category="Study",
        ),
        pdf="figures/{study}/F9_study_balance.pdf",
    log:
        "logs/{study}/figures/F9.log",
    localrule: True
    conda:
        "../../workflow/envs/plot.yaml"
    params:
        dataset=lambda wc: study_param(wc.study, "dataset"),
        models=lambda wc: ["mohge", study_param(wc.study, "reference")],
        ep_sizes=lambda wc: study_param(wc.study, "ep_sizes"),
        bar=lambda wc: study_param(wc.study, "balance_bar"),
        decision_ep=lambda wc: study_param(wc.study, "balance_ep"),
    script:
        "scripts/study_balance.py"


rule fig_study_frontier:
    input:
        s1="results/{study}/study/S1_models.csv",
        s3="results/{study}/study/S3_balance.csv",
    output:
        png=report(
            "figures/{study}/F10_study_frontier.png",
            caption="captions/F10_study_frontier.rst",
            category="Study",
        ),
        pdf="figures/{study}/F10_study_frontier.pdf",
    log:
        "logs/{study}/figures/F10.log",
    localrule: True
    conda:
        "../../workflow/envs/plot.yaml"
    params:
        dataset=lambda wc: study_param(wc.study, "dataset"),
        ep=lambda wc: study_param(wc.study, "balance_ep"),
        bar=lambda wc: study_param(wc.study, "balance_bar"),
        metric=lambda wc: study_param(wc.study, "metric"),
    script:
        "scripts/study_frontier.py"


rule fig_study_difficulty:
    input:
        s4="results/{study}/study/S4_difficulty.csv",
    output:
        png=report(
            "figures/{study}/F11_study_difficulty.png",
            caption="captions/F11_study_difficulty.rst",
            category="Study",
        ),
        pdf="figures/{study}/F11_study_difficulty.pdf",
    log:
        "logs/{study}/figures/F11.log",
    localrule: True
    conda:
        "../../workflow/envs/plot.yaml"
    script:
        "scripts/study_difficulty.py"
