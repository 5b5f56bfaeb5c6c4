# Figures read only the small CSVs under results/: they never need a GPU, and a rebuilt figure is
# byte-identical when its data did not change (fixed PDF/PNG metadata in plotstyle.py).


rule fig_curves:
    input:
        curves="results/curves.csv",
    output:
        png=report(
            "figures/F1_curves.png",
            caption="../report/F1_curves.rst",
            category="Training",
        ),
        pdf="figures/F1_curves.pdf",
    log:
        "logs/figures/F1.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_curves.py"


rule fig_quality_params:
    input:
        runs="results/runs.csv",
    output:
        png=report(
            "figures/F2_quality_params.png",
            caption="../report/F2_quality_params.rst",
            category="Quality",
        ),
        pdf="figures/F2_quality_params.pdf",
    log:
        "logs/figures/F2.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_quality_params.py"


rule fig_groups_by_level:
    input:
        groups="results/groups_by_level.csv",
    output:
        png=report(
            "figures/F3_groups_by_level.png",
            caption="../report/F3_groups_by_level.rst",
            category="Routing",
        ),
        pdf="figures/F3_groups_by_level.pdf",
    log:
        "logs/figures/F3.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    params:
        families=["mohge", "hmoe", "modse"],  # the families whose groups differ in width
    script:
        "../scripts/plot_groups_by_level.py"


rule fig_gpu_load:
    input:
        summary="results/utilization_summary.csv",
        ranks="results/utilization_ranks.csv",
    output:
        png=report(
            "figures/F4_gpu_load.png",
            caption="../report/F4_gpu_load.rst",
            category="Utilization",
        ),
        pdf="figures/F4_gpu_load.pdf",
    log:
        "logs/figures/F4.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    params:
        source=util_source(),
    script:
        "../scripts/plot_gpu_load.py"


rule fig_width:
    input:
        curves="results/curves.csv",
    output:
        png=report(
            "figures/F5_width.png",
            caption="../report/F5_width.rst",
            category="Routing",
        ),
        pdf="figures/F5_width.pdf",
    log:
        "logs/figures/F5.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_width.py"


rule fig_kernels:
    # Kernel throughput from a committed GPU benchmark CSV (kernels/gpu_check.sh); a labelled placeholder
    # when no GPU result has been recorded.
    input:
        kernels=in_checkout(
            config.get("figures", {}).get("bench_csv", "results/bench/kernels.csv")
        ),
    output:
        png=report(
            "figures/F6_kernels.png",
            caption="../report/F6_kernels.rst",
            category="Kernels",
        ),
        pdf="figures/F6_kernels.pdf",
    log:
        "logs/figures/F6.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/plot_kernels.py"
