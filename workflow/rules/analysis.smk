PRESETS = ["mohge-3b", "moe-3b"]


rule params_run:
    # Parameters by component, counted on the model the run trains (meta device, no memory).
    input:
        cfg=f"{RES}/runs/{{run}}/config.json",
    output:
        f"{RES}/runs/{{run}}/params.json",
    log:
        f"{LOGS}/params/{{run}}.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    shell:
        "python -m mohge params {input.cfg:q} --json {output:q} > {log:q} 2>&1"


rule params_preset:
    # The release's 3B MoHGE and its homogeneous 64x1024 MoE: the paper-scale parameter comparison.
    input:
        cfg=os.path.join(CONFIGS, "models", "{preset}.yaml"),
    output:
        f"{RES}/params/preset-{{preset}}.json",
    log:
        f"{LOGS}/params/preset-{{preset}}.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    shell:
        "python -m mohge params {input.cfg:q} --json {output:q} > {log:q} 2>&1"


rule utilization:
    # Analytic per-rank FLOPs and memory of every placement strategy at every EP size, from one model's
    # routing trace; for MoHGE also the measured per-rank expert time on torch.distributed ranks.
    input:
        trace=f"{WORK}/runs/{{run}}/trace.json",
    output:
        summary=f"{RES}/utilization/{{run}}/summary.csv",
        ranks=f"{RES}/utilization/{{run}}/analytic.csv",
    log:
        f"{LOGS}/utilization/{{run}}.log",
    # a trained run is finished (evaluated, traced, placed) before the next training starts: a study
    # stopped midway leaves whole runs
    priority: 1
    conda:
        "../envs/train.yaml"
    # the measurement (measure_nproc > 0, MoHGE only) runs torch.distributed ranks as processes, or every rank in
    # turns in one process on the one GPU of a GPU node with fewer GPUs than ranks; the analytic placement alone is
    # one thread, so it runs beside a training
    threads: lambda wc: PLAN.utilization_threads(wc.run)
    resources:
        gpu=lambda wc: PLAN.utilization_gpus(wc.run),
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 20 * attempt,
    params:
        out=lambda wc, output: os.path.dirname(output.summary),
        strategies=list(PLAN.util.strategies),
        ep=list(PLAN.util.ep_sizes),
        measure=lambda wc: PLAN.utilization_measure(wc.run),
    shell:
        "python -m mohge utilization --trace {input.trace:q} --strategies {params.strategies:q}"
        " --ep {params.ep:q} {params.measure:q} --out {params.out:q} > {log:q} 2>&1"


rule collect:
    # Every per-run summary into the few CSVs that tables and figures read.
    input:
        summaries=expand(f"{RES}/runs/{{run}}/summary.json", run=RUNS),
        metrics=expand(f"{RES}/runs/{{run}}/metrics.json", run=RUNS),
        params=expand(f"{RES}/runs/{{run}}/params.json", run=RUNS),
        presets=expand(f"{RES}/params/preset-{{preset}}.json", preset=PRESETS),
        traces=expand(f"{RES}/runs/{{run}}/trace.json", run=PLAN.traced),
        utilization=expand(f"{RES}/utilization/{{run}}/summary.csv", run=PLAN.traced),
    output:
        runs=f"{RES}/runs.csv",
        curves=f"{RES}/curves.csv",
        groups=f"{RES}/groups_by_level.csv",
        params=f"{RES}/params.csv",
        util_summary=f"{RES}/utilization_summary.csv",
        util_ranks=f"{RES}/utilization_ranks.csv",
    log:
        f"{LOGS}/collect.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    params:
        results=lambda wc, output: os.path.dirname(output.runs),
        runs=list(RUNS),
        traced=PLAN.traced,
        presets=PRESETS,
    shell:
        "python -m mohge collect --results {params.results:q} --runs {params.runs:q} --traced {params.traced:q}"
        " --presets {params.presets:q} --out {params.results:q} > {log:q} 2>&1"


rule inference_table:
    # Every run's inference record into one row per run and knob point, and T4 (means over seeds).
    input:
        records=expand(f"{RES}/inference/{{run}}.json", run=PLAN.inference_runs()),
    output:
        rows=f"{RES}/inference.csv",
        csv=f"{RES}/tables/T4_inference.csv",
        md=f"{RES}/tables/T4_inference.md",
    log:
        f"{LOGS}/inference_table.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    script:
        "../scripts/inference_table.py"


rule frontier_test:
    # T5: the served-frontier test the config declares (inference.frontier_test; docs/study.md).
    input:
        rows=f"{RES}/inference.csv",
    output:
        csv=f"{RES}/tables/T5_frontier.csv",
        md=f"{RES}/tables/T5_frontier.md",
    log:
        f"{LOGS}/frontier_test.log",
    localrule: True
    conda:
        "../envs/plot.yaml"
    params:
        **PLAN.frontier_test(),
    script:
        "../scripts/frontier_test.py"
