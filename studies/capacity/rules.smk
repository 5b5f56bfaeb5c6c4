# The capacity study's declared analysis (studies/capacity; docs/study.md "The capacity study"), for every study
# whose config declares `analysis.design: capacity`: it reads only the study's collected CSVs, its committed routing
# traces and training logs, so `figures` redraws it with no training job. Paths of scripts, captions and conda envs
# are relative to this file.
from mohge_studies import capacity


rule capacity_analysis:
    # The capacity study's declared tests (docs/study.md "The capacity study"): gate, claim 1, the sweep fit,
    # heterogeneity, unused experts; tables C1-C5 (C4 the selection, C5 the best shot) and the
    # bits-stored-vs-parameters figure.
    input:
        runs="results/{study}/runs.csv",
        traces=study_traces,
        logs=study_logs,  # C3's steps with an unused expert
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
            for t in capacity.TABLES
            for ext in ["csv", "md", "tex", "html"]
        },
        png=report(
            f"figures/{{study}}/{capacity.FIGURE}.png",
            caption="captions/C1_bits_params.rst",
            category="Study",
        ),
        pdf=f"figures/{{study}}/{capacity.FIGURE}.pdf",
    log:
        "logs/{study}/capacity_analysis.log",
    localrule: True
    conda:
        "../../workflow/envs/train.yaml"  # scipy
    params:
        settings=lambda wc: PLAN.design_settings(wc.study),
    script:
        "scripts/capacity_analysis.py"
