rule dataset_config:
    # The data section of a dataset, as the file `python -m mohge.data` reads.
    output:
        f"{WORK}/data/{{dataset}}.data.json",
    log:
        f"{LOGS}/data/{{dataset}}.config.log",
    localrule: True
    params:
        data=lambda wc: digest(dataset_section(wc.dataset)),  # a changed data section reruns
    run:
        from mohge.atomic import write_text_atomic

        section = dataset_section(wildcards.dataset)
        write_text_atomic(output[0], json.dumps(section, sort_keys=True) + "\n")
        write_text_atomic(log[0], f"data {params.data}\n")


rule prepare_data:
    # Fetch (pinned sha256) or generate the corpus, split it (Shakespeare by whole plays), train the
    # byte-level BPE on the training split only and encode every split into token memmaps.
    input:
        cfg=f"{WORK}/data/{{dataset}}.data.json",
    output:
        meta=f"{WORK}/data/{{dataset}}/meta.json",
        tokenizer=f"{WORK}/data/{{dataset}}/tokenizer.json",
    log:
        f"{LOGS}/data/{{dataset}}.log",
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,  # BPE training holds the training text in memory
        runtime=lambda wc, attempt: 20 * attempt,  # minutes; the download is a few MB
    params:
        out=lambda wc, output: os.path.dirname(output.meta),
    shell:
        "python -m mohge.data --config {input.cfg:q} --out {params.out:q} > {log:q} 2>&1"
