rule dataset_config:
    # The data section of a dataset, as the file `python -m mohge.data` reads; its text reaches the command as in
    # run_config (train.smk), its hash is the param that reruns it.
    output:
        f"{WORK}/data/{{dataset}}.data.json",
    log:
        f"{LOGS}/data/{{dataset}}.config.log",
    localrule: True
    conda:
        "../envs/train.yaml"  # the shell's printf only: the env of the rules that read the file
    params:
        data=lambda wc: digest(dataset_section(wc.dataset)),  # a changed data section reruns
        text=lambda wc, output: dataset_config_json(wc.dataset),
    shell:
        "printf '%s' {params.text:q} > {output:q}"
        " && printf 'data %s\\n' {params.data:q} > {log:q}"


# Scatter/gather (docs/method.md §12): one tokenizer job, data.num_shards shard jobs that each stream only
# their slice of the source and run in parallel, and a gather job that verifies every shard and writes
# meta.json last.


rule data_tokenizer:
    # The byte-level BPE trained on a bounded sample of the training split (data.tokenizer_train_docs /
    # tokenizer_train_bytes), or a given tokenizer.json / hub tokenizer, checked against data.vocab_size.
    input:
        cfg=f"{WORK}/data/{{dataset}}.data.json",
    output:
        tokenizer=f"{WORK}/data/{{dataset}}/tokenizer.json",
        info=f"{WORK}/data/{{dataset}}/shards/tokenizer-info.json",
    log:
        f"{LOGS}/data/{{dataset}}.tokenizer.log",
    conda:
        "../envs/train.yaml"
    threads: 4  # the BPE trainer counts pairs in parallel
    resources:
        mem_mb=lambda wc, attempt: 8000 * attempt,  # pair counts of the sample's distinct words
        runtime=lambda wc, attempt: data_job_minutes(wc.dataset, attempt, 60),  # the sample is bounded
    params:
        out=lambda wc, output: os.path.dirname(output.tokenizer),
    shell:
        "python -m mohge.data tokenizer --config {input.cfg:q} --out {params.out:q} > {log:q} 2>&1"


rule data_shard:
    # Shard job {shard} of data.num_shards: streams its slice of the source and writes the token shards of
    # every split incrementally (memory bounded by one encode batch); its part-*.json is written last and
    # lists every file it wrote. Only train's shard is declared: with data.val_tokens/test_tokens the job
    # writes no val/test shard but its hold-out candidates (shards/cand-*), cut by the gather (§12.2).
    input:
        cfg=f"{WORK}/data/{{dataset}}.data.json",
        tokenizer=f"{WORK}/data/{{dataset}}/tokenizer.json",
        info=f"{WORK}/data/{{dataset}}/shards/tokenizer-info.json",
    output:
        part=f"{WORK}/data/{{dataset}}/shards/part-{{shard}}.json",
        train=f"{WORK}/data/{{dataset}}/shards/train-{{shard}}.bin",
    log:
        f"{LOGS}/data/{{dataset}}.shard-{{shard}}.log",
    wildcard_constraints:
        shard="[0-9]{5}",
    conda:
        "../envs/train.yaml"
    threads: 4  # tokenizers' encode_batch runs on this many threads (RAYON_NUM_THREADS)
    resources:
        mem_mb=lambda wc, attempt: 2000 * attempt,  # one encode batch at a time, whatever the corpus size
        runtime=lambda wc, attempt: data_job_minutes(wc.dataset, attempt, 120),  # 1/num_shards of it
    params:
        out=lambda wc, output: os.path.dirname(os.path.dirname(output.part)),
        index=lambda wc: int(wc.shard),
    shell:
        "RAYON_NUM_THREADS={threads} python -m mohge.data shard --index {params.index} "
        "--config {input.cfg:q} --out {params.out:q} > {log:q} 2>&1"


rule prepare_data:
    # The gather job: every shard's size and sha256 checked against its job's manifest, val/test cut from
    # the candidates when held out by token count, the held-out text for lm-eval (bounded by
    # data.eval_docs_max), and meta.json (format version 2) written last.
    input:
        cfg=f"{WORK}/data/{{dataset}}.data.json",
        tokenizer=f"{WORK}/data/{{dataset}}/tokenizer.json",
        parts=data_parts,
    output:
        meta=f"{WORK}/data/{{dataset}}/meta.json",
    log:
        f"{LOGS}/data/{{dataset}}.log",
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 2000 * attempt,  # streams the shards; ~80 bytes per hold-out candidate
        runtime=lambda wc, attempt: data_job_minutes(wc.dataset, attempt, 60),  # reads every shard once
    params:
        out=lambda wc, output: os.path.dirname(output.meta),
    shell:
        "python -m mohge.data gather --config {input.cfg:q} --out {params.out:q} > {log:q} 2>&1"
