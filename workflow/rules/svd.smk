# The teacher's MLP singular bases, computed once per teacher.


rule svd:
    input:
        teacher="results/{exp}/teacher",
    output:
        directory("results/{exp}/svd"),
    params:
        flags=flags_of("svd"),
    log:
        "logs/{exp}/svd.log",
    benchmark:
        "benchmarks/{exp}/svd.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("svd", "threads")
    resources:
        gpu=resource("svd", "gpu"),
        mem_mb=resource("svd", "mem_mb"),
        runtime=resource("svd", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc svd --teacher {input.teacher} --out {output} {params.flags} > {log} 2>&1"
