# The built-in tiny world: corpus, chat set, tasks, tokenizer and the teacher's config.


rule world:
    output:
        directory("results/{exp}/world"),
    params:
        flags=flags_of("world"),
    log:
        "logs/{exp}/world.log",
    benchmark:
        "benchmarks/{exp}/world.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("world", "threads")
    resources:
        mem_mb=resource("world", "mem_mb"),
        runtime=resource("world", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc world --out {output} {params.flags} > {log} 2>&1"
