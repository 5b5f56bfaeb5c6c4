rule evaluate:
    # lm-eval, offline unless eval.allow_hub: perplexity on held-out text, cloze, continuation choice and graded tasks
    # built from the dataset's held-out split, plus val/test loss computed directly. The eval section comes from
    # the run's config.json, so an eval-only change reruns this job and not training.
    input:
        model=f"{WORK}/runs/{{run}}/model.safetensors",
        cfg=f"{RES}/runs/{{run}}/config.json",
        meta=data_meta,
    output:
        metrics=f"{RES}/runs/{{run}}/metrics.json",
    log:
        f"{LOGS}/eval/{{run}}.log",
    benchmark:
        f"{RES}/benchmarks/eval/{{run}}.tsv"
    # a trained run is finished (evaluated, traced, placed) before the next training starts: a study
    # stopped midway leaves whole runs
    priority: 1
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        gpu=PLAN.eval_gpus(),
        mem_mb=eval_mem_mb,  # weights + activations (mohge_studies.workflow.resources)
        runtime=eval_runtime,
    params:
        eval=lambda wc: digest(to_dict(RUNS[wc.run].eval)),
        ckpt=lambda wc, input: os.path.dirname(input.model),
        data=data_dir,
        hub=lambda wc: "--allow-hub" if RUNS[wc.run].eval.allow_hub else "",
    shell:
        "python -m mohge.evaluate --ckpt {params.ckpt:q} --eval-config {input.cfg:q} --data {params.data:q}"
        " --out {output.metrics:q} {params.hub} > {log:q} 2>&1"


rule trace:
    # Routing on held-out data: tokens per expert and group, per layer and difficulty level. The replayable
    # per-token routing (.npz) stays in work/; the small JSON summary is copied into results/.
    input:
        model=f"{WORK}/runs/{{run}}/model.safetensors",
        cfg=f"{RES}/runs/{{run}}/config.json",
        meta=data_meta,
    output:
        trace=f"{WORK}/runs/{{run}}/trace.json",
        summary=f"{RES}/runs/{{run}}/trace.json",
    log:
        f"{LOGS}/trace/{{run}}.log",
    # a trained run is finished (evaluated, traced, placed) before the next training starts: a study
    # stopped midway leaves whole runs
    priority: 1
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        gpu=PLAN.eval_gpus(),
        mem_mb=eval_mem_mb,  # weights + activations (mohge_studies.workflow.resources)
        runtime=eval_runtime,
    params:
        # eval.heldout_batches only where set: a study without it keeps the digest its traces were made with
        trace=lambda wc: digest(
            [RUNS[wc.run].eval.batch_size, RUNS[wc.run].eval.trace_batches]
            + (
                [RUNS[wc.run].eval.heldout_batches]
                if RUNS[wc.run].eval.heldout_batches
                else []
            )
        ),
        ckpt=lambda wc, input: os.path.dirname(input.model),
        data=data_dir,
        device="cuda" if PLAN.eval_gpus() else "cpu",
    shell:
        "python -m mohge traces --ckpt {params.ckpt:q} --eval-config {input.cfg:q} --data {params.data:q}"
        " --device {params.device} --out {output.trace:q} > {log:q} 2>&1"
        " && cp {output.trace:q} {output.summary:q}"


rule inference:
    # Serving cost per token (prefill and cached-decode tokens/s, memory, activated FLOPs as routed) and
    # validation perplexity at every knob point of the config's `inference` section, without retraining.
    input:
        model=f"{WORK}/runs/{{run}}/model.safetensors",
        cfg=f"{RES}/runs/{{run}}/config.json",
        meta=data_meta,
    output:
        record=f"{RES}/inference/{{run}}.json",
    log:
        f"{LOGS}/inference/{{run}}.log",
    benchmark:
        f"{RES}/benchmarks/inference/{{run}}.tsv"
    conda:
        "../envs/train.yaml"
    # one torch thread: the timings are the thread's CPU time, so a training beside it does not slow them
    threads: 1
    resources:
        mem_mb=eval_mem_mb,  # weights + activations (mohge_studies.workflow.resources)
        runtime=eval_runtime,
    params:
        ckpt=lambda wc, input: os.path.dirname(input.model),
        data=data_dir,
        args=PLAN.inference_args(),
    shell:
        "python -m mohge_studies.bench inference --models {params.ckpt:q} --data {params.data:q} {params.args:q}"
        " --out {output.record:q} > {log:q} 2>&1"
