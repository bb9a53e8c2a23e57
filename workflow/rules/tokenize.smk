# Token directories (train/, valid/) for the distillation corpus and the SFT chat set. The
# tiny world brings its own text and tokenizer; a hub teacher brings its tokenizer and the
# config names the dataset.


rule tokenize:
    input:
        unpack(tokenize_source),
    output:
        directory("results/{exp}/data/{kind}"),
    wildcard_constraints:
        kind="corpus|sft",
    params:
        paths=tokenize_paths,
        flags=flags_of("tokenize"),
    log:
        "logs/{exp}/tokenize_{kind}.log",
    benchmark:
        "benchmarks/{exp}/tokenize_{kind}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("tokenize", "threads")
    resources:
        mem_mb=resource("tokenize", "mem_mb"),
        runtime=resource("tokenize", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc tokenize {params.paths} --out {output} {params.flags} > {log} 2>&1"
