# The teacher's MLP singular bases, computed once per teacher.


rule svd:
    input:
        teacher="results/{exp}/teacher",
    output:
        directory("results/{exp}/svd"),
    params:
        flags=section("svd"),
    log:
        "logs/{exp}/svd.log",
    benchmark:
        "benchmarks/{exp}/svd.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: res("svd", "threads")
    resources:
        gpu=res("svd", "gpu"),
        mem_mb=res("svd", "mem_mb"),
        runtime=res("svd", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc svd --teacher {input.teacher} --out {output} {params.flags} > {log} 2>&1"
