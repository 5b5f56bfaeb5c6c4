rule dataset_config:
    # The data section of a dataset, as the file `python -m mohge.data` reads.
    output:
        "work/data/{dataset}.data.json",
    log:
        "logs/data/{dataset}.config.log",
    localrule: True
    conda:
        "../envs/train.yaml"
    params:
        cfg=dataset_config_json,
    run:
        from mohge.atomic import write_text_atomic

        write_text_atomic(output[0], f"{params.cfg}\n")


rule prepare_data:
    # Fetch (pinned sha256) or generate the corpus, split it (Shakespeare by whole plays), train the
    # byte-level BPE on the training split only and encode every split into token memmaps.
    input:
        cfg="work/data/{dataset}.data.json",
    output:
        meta="work/data/{dataset}/meta.json",
        tokenizer="work/data/{dataset}/tokenizer.json",
    log:
        "logs/data/{dataset}.log",
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,  # BPE training holds the training text in memory
        runtime=lambda wc, attempt: 20 * attempt,  # minutes; the download is a few MB
    params:
        out=lambda wc, output: os.path.dirname(output.meta),
    shell:
        "python -m mohge.data --config {input.cfg} --out {params.out} > {log} 2>&1"
