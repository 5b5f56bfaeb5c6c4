PRESETS = ["mohge-3b", "moe-3b"]


rule params_run:
    # Parameters by component, counted on the model the run trains (meta device, no memory).
    input:
        cfg="results/runs/{run}/config.json",
    output:
        "results/runs/{run}/params.json",
    log:
        "logs/params/{run}.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    shell:
        "python -m mohge.params {input.cfg} --json {output} > {log} 2>&1"


rule params_preset:
    # The release's 3B MoHGE and its homogeneous 64x1024 MoE: the paper-scale parameter comparison.
    input:
        cfg=os.path.join(workflow.basedir, "configs", "models", "{preset}.yaml"),
    output:
        "results/params/preset-{preset}.json",
    log:
        "logs/params/preset-{preset}.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    shell:
        "python -m mohge.params {input.cfg} --json {output} > {log} 2>&1"


rule utilization:
    # Analytic per-rank FLOPs and memory of every placement strategy at every EP size, from one model's
    # routing trace; for MoHGE also the measured per-rank expert time on torch.distributed ranks.
    input:
        trace="work/runs/{run}/trace.json",
    output:
        summary="results/utilization/{run}/summary.csv",
        ranks="results/utilization/{run}/analytic.csv",
    log:
        "logs/utilization/{run}.log",
    conda:
        "../envs/train.yaml"
    threads: 2  # the measurement runs torch.distributed ranks as processes
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 20 * attempt,
    params:
        out=lambda wc, output: os.path.dirname(output.summary),
        strategies=" ".join(UTIL.get("strategies", ["contiguous", "all_size"])),
        ep=" ".join(str(e) for e in UTIL.get("ep_sizes", [2, 4, 8])),
        measure=lambda wc: (
            f"--measure --nproc {UTIL.get('measure_nproc', 0)}"
            if RUNS[wc.run].family == "mohge" and UTIL.get("measure_nproc", 0) > 0
            else ""
        ),
    shell:
        "python -m mohge.utilization --trace {input.trace} --strategies {params.strategies} --ep {params.ep}"
        " {params.measure} --out {params.out} > {log} 2>&1"


rule collect:
    # Every per-run summary into the few CSVs that tables and figures read.
    input:
        summaries=expand("results/runs/{run}/summary.json", run=RUNS),
        metrics=expand("results/runs/{run}/metrics.json", run=RUNS),
        params=expand("results/runs/{run}/params.json", run=RUNS),
        presets=expand("results/params/preset-{preset}.json", preset=PRESETS),
        traces=expand("results/runs/{run}/trace.json", run=trace_runs()),
        utilization=expand("results/utilization/{run}/summary.csv", run=trace_runs()),
    output:
        runs="results/runs.csv",
        curves="results/curves.csv",
        groups="results/groups_by_level.csv",
        params="results/params.csv",
        util_summary="results/utilization_summary.csv",
        util_ranks="results/utilization_ranks.csv",
    log:
        "logs/collect.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    params:
        runs=" ".join(RUNS),
        traced=" ".join(trace_runs()),
        presets=" ".join(PRESETS),
    shell:
        "python -m mohge.collect --results results --runs {params.runs} --traced {params.traced}"
        " --presets {params.presets} --out results > {log} 2>&1"


rule tables:
    input:
        runs="results/runs.csv",
        params="results/params.csv",
        util="results/utilization_summary.csv",
    output:
        **{
            f"{t}_{ext}": f"results/tables/{t}.{ext}"
            for t in ["T1_main", "T2_params", "T3_balance"]
            for ext in ["csv", "md", "tex"]
        },
    log:
        "logs/tables.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    params:
        source=util_source(),  # T3 shows the imbalance on the MoHGE model's routing
    script:
        "../scripts/make_tables.py"
