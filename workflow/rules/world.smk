# The built-in tiny world: corpus, chat set, tasks, tokenizer and the teacher's config.


rule world:
    output:
        directory("results/{exp}/world"),
    params:
        flags=section("world"),
    log:
        "logs/{exp}/world.log",
    benchmark:
        "benchmarks/{exp}/world.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: res("world", "threads")
    resources:
        mem_mb=res("world", "mem_mb"),
        runtime=res("world", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc world --out {output} {params.flags} > {log} 2>&1"
