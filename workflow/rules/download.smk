# A hub teacher at a pinned revision (safetensors, config, tokenizer).


rule download:
    output:
        directory("results/{exp}/teacher"),
    wildcard_constraints:
        exp=exp_pattern(hub=True),
    params:
        flags=flags_of("download"),
    log:
        "logs/{exp}/download.log",
    benchmark:
        "benchmarks/{exp}/download.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("download", "threads")
    resources:
        mem_mb=resource("download", "mem_mb"),
        runtime=resource("download", "runtime"),
    shell:
        "lrc download --out {output} {params.flags} > {log} 2>&1"
