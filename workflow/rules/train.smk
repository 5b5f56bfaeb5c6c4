rule run_config:
    # One resolved config per run: what `python -m mohge.train --config` reads, so any run can be repeated by
    # hand. The params train and eval are short hashes of its sections: a rerun reason names the section that
    # changed. The file's text is a param computed from the output (Snakemake keeps such params out of its rerun
    # triggers), so it reaches the command without showing in a reason; a shell job runs on a thread of Snakemake's
    # own process, where a `run:` job would start another Snakemake. It is written again whenever the training
    # config is: a clone holds a committed config.json of each run of the default study but no work/, so the runs
    # it trains are evaluated and traced with the eval section of the config as it is now, not as committed.
    input:
        f"{WORK}/configs/{{run}}.train.json",
    output:
        f"{RES}/runs/{{run}}/config.json",
    log:
        f"{LOGS}/config/{{run}}.log",
    localrule: True
    conda:
        "../envs/train.yaml"  # the shell's printf only: the env of the rules that read the file
    params:
        train=train_digest,
        eval=lambda wc: digest(to_dict(RUNS[wc.run].eval)),
        text=lambda wc, output: run_config_json(wc.run),
    shell:
        "printf '%s' {params.text:q} > {output:q}"
        " && printf 'train %s eval %s\\n' {params.train:q} {params.eval:q} > {log:q}"


rule train_config:
    # What training reads: the run config without its eval section, so an eval-only change leaves this file,
    # and the trained model, alone (evaluate and trace read the eval section from config.json). Its text reaches
    # the command as in run_config.
    output:
        f"{WORK}/configs/{{run}}.train.json",
    log:
        f"{LOGS}/config/{{run}}.train.log",
    localrule: True
    conda:
        "../envs/train.yaml"  # the shell's printf only: the env of the rules that read the file
    params:
        train=train_digest,
        text=lambda wc, output: train_config_json(wc.run),
    shell:
        "printf '%s' {params.text:q} > {output:q}"
        " && printf 'train %s\\n' {params.train:q} > {log:q}"


rule train:
    # Resumable state (step_* checkpoints) lives in the undeclared scratch folder, which Snakemake never
    # deletes: a killed or failed job resumes from its last valid checkpoint when rerun. The scratch is named
    # by the hash of what training depends on, so a training change starts fresh; older ones are kept aside.
    input:
        cfg=f"{WORK}/configs/{{run}}.train.json",
        meta=data_meta,
    output:
        model=f"{WORK}/runs/{{run}}/model.safetensors",
        summary=f"{RES}/runs/{{run}}/summary.json",
        curve=f"{RES}/runs/{{run}}/train_log.jsonl",
    log:
        f"{LOGS}/train/{{run}}.log",
    benchmark:
        f"{RES}/benchmarks/train/{{run}}.tsv"
    conda:
        "../envs/train.yaml"
    threads: CLUSTER.cpus_per_task  # 1 by default: two CPU runs share a 2-core machine
    resources:
        # sizes from the config's `cluster` section, the same on every attempt (mohge_studies.workflow.resources)
        **PLAN.train_resources(),
    params:
        train=train_digest,
        out=lambda wc, output: os.path.dirname(output.model),
        scratches=f"{WORK}/scratch/{{run}}",
        scratch=lambda wc: f"{WORK}/scratch/{wc.run}/{train_digest(wc)}",
        data=data_dir,
        launch=PLAN.train_launcher(),  # built from integers only
        gpus=CLUSTER.gpus_per_node,
    # `trap '' TERM`: this shell outlives a SIGTERM from SLURM (--signal in workflow/profiles/slurm) while
    # mohge.train, which sets its own handler, finishes its step and checkpoints; it then exits 143 (a retry).
    shell:
        "trap '' TERM; "
        'for old in {params.scratches:q}/*; do if [ -d "$old" ] && [ "$old" != {params.scratch:q} ]; then'
        ' echo "train: $old holds checkpoints of another config: kept aside; starting fresh in" {params.scratch:q};'
        " fi; done > {log:q} 2>&1"
        " && {params.launch} mohge.train --config {input.cfg:q} --data {params.data:q} --out {params.out:q}"
        " --scratch {params.scratch:q} --gpus {params.gpus} >> {log:q} 2>&1"
        " && cp {params.out:q}/summary.json {output.summary:q}"
        " && cp {params.out:q}/train_log.jsonl {output.curve:q}"
