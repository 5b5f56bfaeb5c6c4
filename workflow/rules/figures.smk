# Tables and figures read only the small CSVs under results/<study>/: they never need a GPU, and a rebuilt
# figure is byte-identical when its data did not change (fixed PDF/PNG metadata in plotstyle.py). The rules
# take the study as a wildcard, so `figures` redraws every committed study from its committed CSVs.


rule tables:
    input:
        runs="results/{study}/runs.csv",
        params="results/{study}/params.csv",
        util="results/{study}/utilization_summary.csv",
    output:
        # the HTML tables go into `snakemake --report` (category Tables), shown inline beside the figures
        **{
            f"{t}_{ext}": (
                report(
                    f"results/{{study}}/tables/{t}.{ext}",
                    caption=f"../report/{t}.rst",
                    category="Tables",
                )
                if ext == "html"
                else f"results/{{study}}/tables/{t}.{ext}"
            )
            for t in ["T1_main", "T2_params", "T3_balance"]
            for ext in ["csv", "md", "tex", "html"]
        },
    log:
        "logs/{study}/tables.log",
    localrule: True
    conda:
        "../envs/train.yaml"  # make_tables takes the task filter from mohge_studies.analysis.tasks (scipy)
    params:
        # T3 shows the imbalance on the MoHGE model's routing
        source=lambda wc: PLAN.study_source(wc.study),
        alpha=lambda wc: study_param(wc.study, "alpha"),  # T1's chance and ceiling tests
        heldout_batches=lambda wc: study_param(wc.study, "heldout_batches"),  # T1 names the splits' part its ppl reads
    script:
        "../scripts/make_tables.py"


rule fig_curves:
    input:
        curves="results/{study}/curves.csv",
    output:
        png=report(
            "figures/{study}/F1_curves.png",
            caption="../report/F1_curves.rst",
            category="Training",
        ),
        pdf="figures/{study}/F1_curves.pdf",
    log:
        "logs/{study}/figures/F1.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_curves.py"


rule fig_quality_params:
    input:
        runs="results/{study}/runs.csv",
    output:
        png=report(
            "figures/{study}/F2_quality_params.png",
            caption="../report/F2_quality_params.rst",
            category="Quality",
        ),
        pdf="figures/{study}/F2_quality_params.pdf",
    log:
        "logs/{study}/figures/F2.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    params:
        metric=lambda wc: study_param(wc.study, "metric"),  # the primary endpoint
    script:
        "../scripts/plot_quality_params.py"


rule fig_groups_by_level:
    input:
        groups="results/{study}/groups_by_level.csv",
    output:
        png=report(
            "figures/{study}/F3_groups_by_level.png",
            caption="../report/F3_groups_by_level.rst",
            category="Routing",
        ),
        pdf="figures/{study}/F3_groups_by_level.pdf",
    log:
        "logs/{study}/figures/F3.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    params:
        families=["mohge", "hmoe", "modse"],  # the families whose groups differ in width
    script:
        "../scripts/plot_groups_by_level.py"


rule fig_gpu_load:
    input:
        summary="results/{study}/utilization_summary.csv",
        ranks="results/{study}/utilization_ranks.csv",
    output:
        png=report(
            "figures/{study}/F4_gpu_load.png",
            caption="../report/F4_gpu_load.rst",
            category="Utilization",
        ),
        pdf="figures/{study}/F4_gpu_load.pdf",
    log:
        "logs/{study}/figures/F4.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    params:
        source=lambda wc: PLAN.study_source(wc.study),
    script:
        "../scripts/plot_gpu_load.py"


rule fig_width:
    input:
        curves="results/{study}/curves.csv",
    output:
        png=report(
            "figures/{study}/F5_width.png",
            caption="../report/F5_width.rst",
            category="Routing",
        ),
        pdf="figures/{study}/F5_width.pdf",
    log:
        "logs/{study}/figures/F5.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_width.py"


rule fig_load:
    input:
        curves="results/{study}/curves.csv",
    output:
        png=report(
            "figures/{study}/F14_load.png",
            caption="../report/F14_load.rst",
            category="Routing",
        ),
        pdf="figures/{study}/F14_load.pdf",
    log:
        "logs/{study}/figures/F14.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_load.py"


rule fig_idle:
    # Read from every run's training log (its per-layer counts), not from curves.csv, which sums the layers.
    input:
        runs="results/{study}/runs.csv",
        logs=study_logs,
    output:
        png=report(
            "figures/{study}/F15_idle.png",
            caption="../report/F15_idle.rst",
            category="Routing",
        ),
        pdf="figures/{study}/F15_idle.pdf",
    log:
        "logs/{study}/figures/F15.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_idle.py"


rule fig_kernels:
    # Kernel throughput from a committed GPU benchmark CSV (kernels/gpu_check.sh). Part of a study's figures
    # only when that CSV holds a GPU measurement (mohge_studies.workflow.checkout.measured_kernels); asked for without one, it is a
    # labelled placeholder that no results set contains.
    input:
        kernels=bench_csv,
    output:
        png=report(
            "figures/{study}/F6_kernels.png",
            caption="../report/F6_kernels.rst",
            category="Kernels",
        ),
        pdf="figures/{study}/F6_kernels.pdf",
    log:
        "logs/{study}/figures/F6.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_kernels.py"


rule fig_inference:
    input:
        rows="results/{study}/inference.csv",
    output:
        # not in the report: the records need the trained weights, which a clone of a committed study lacks
        png="figures/{study}/F13_inference.png",
        pdf="figures/{study}/F13_inference.pdf",
    log:
        "logs/{study}/figures/F13.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_inference.py"


rule figures:
    # Every committed study's tables and figures from its committed results/<study>/*.csv alone: with
    # `snakemake --cores 1 figures` no training, evaluation or collect job is part of the plan.
    input:
        PLAN.committed_outputs(),
    localrule: True
