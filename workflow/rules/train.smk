rule resolve_config:
    # One resolved config per run: the only file `python -m mohge.train` reads (any run can be repeated by hand).
    output:
        "results/runs/{run}/config.json",
    log:
        "logs/config/{run}.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    params:
        cfg=run_config_json,
    run:
        from mohge.atomic import write_text_atomic

        write_text_atomic(
            output[0], json.dumps(json.loads(params.cfg), indent=2) + "\n"
        )


rule train:
    # Resumable state (step_* checkpoints) lives in the undeclared scratch folder, which Snakemake never
    # deletes: a killed or failed job resumes from its last valid checkpoint when rerun.
    input:
        cfg="results/runs/{run}/config.json",
        meta=data_meta,
    output:
        model="work/runs/{run}/model.safetensors",
        summary="results/runs/{run}/summary.json",
        curve="results/runs/{run}/train_log.jsonl",
    log:
        "logs/train/{run}.log",
    benchmark:
        "results/benchmarks/train/{run}.tsv"
    conda:
        "../envs/train.yaml"
    threads: 1  # one BLAS thread per CPU job lets two runs share a 2-core machine; GPU jobs use the GPU
    resources:
        gpu=0,  # GPUs per training job: set by the cluster profile (e.g. 8 for the paper config)
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 60 * attempt,  # minutes; the cluster profile raises it for paper scale
    params:
        out=lambda wc, output: os.path.dirname(output.model),
        scratch="work/scratch/{run}",
        data=data_dir,
        launch=lambda wc, resources: launcher(resources),
    shell:
        "{params.launch} mohge.train --config {input.cfg} --data {params.data} --out {params.out}"
        " --scratch {params.scratch} --gpus {resources.gpu} > {log} 2>&1"
        " && cp {params.out}/summary.json {output.summary}"
        " && cp {params.out}/train_log.jsonl {output.curve}"
