rule evaluate:
    # lm-eval, offline unless eval.allow_hub: perplexity on held-out text, cloze, continuation choice and graded tasks
    # built from the dataset's held-out split, plus val/test loss computed directly.
    input:
        model="work/runs/{run}/model.safetensors",
        meta=data_meta,
    output:
        metrics="results/runs/{run}/metrics.json",
    log:
        "logs/eval/{run}.log",
    benchmark:
        "results/benchmarks/eval/{run}.tsv"
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        gpu=0,
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        ckpt=lambda wc, input: os.path.dirname(input.model),
        data=data_dir,
        hub=lambda wc: "--allow-hub" if RUNS[wc.run].eval.allow_hub else "",
    shell:
        "python -m mohge.evaluate --ckpt {params.ckpt} --data {params.data} --out {output.metrics} {params.hub}"
        " > {log} 2>&1"


rule trace:
    # Routing on held-out data: tokens per expert and group, per layer and difficulty level. The replayable
    # per-token routing (.npz) stays in work/; the small JSON summary is copied into results/.
    input:
        model="work/runs/{run}/model.safetensors",
        meta=data_meta,
    output:
        trace="work/runs/{run}/trace.json",
        summary="results/runs/{run}/trace.json",
    log:
        "logs/trace/{run}.log",
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 20 * attempt,
    params:
        ckpt=lambda wc, input: os.path.dirname(input.model),
        data=data_dir,
    shell:
        "python -m mohge.traces --ckpt {params.ckpt} --data {params.data} --out {output.trace} > {log} 2>&1"
        " && cp {output.trace} {output.summary}"
