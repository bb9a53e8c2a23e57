# A hub teacher at a pinned revision (safetensors, config, tokenizer).


rule download:
    output:
        directory("results/{exp}/teacher"),
    wildcard_constraints:
        exp=exp_pattern(hub=True),
    params:
        flags=section("teacher", "hub"),
    log:
        "logs/{exp}/download.log",
    benchmark:
        "benchmarks/{exp}/download.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: res("download", "threads")
    resources:
        mem_mb=res("download", "mem_mb"),
        runtime=res("download", "runtime"),
    shell:
        "lrc download --out {output} {params.flags} > {log} 2>&1"
