# The one LRC warm start (plain LRC, slice arm) that every arm continues from.


rule warmstart:
    input:
        teacher="results/{exp}/teacher",
        bases="results/{exp}/svd",
        data="results/{exp}/data/corpus",
    output:
        directory("results/{exp}/warmstart"),
    params:
        hidden=lambda wildcards: X(wildcards.exp)["student"]["hidden_size"],
        flags=section("warmstart"),
    log:
        "logs/{exp}/warmstart.log",
    benchmark:
        "benchmarks/{exp}/warmstart.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: res("warmstart", "threads")
    resources:
        gpu=res("warmstart", "gpu"),
        mem_mb=res("warmstart", "mem_mb"),
        runtime=res("warmstart", "runtime"),
        accelerate=res("warmstart", "accelerate"),
    shell:
        "OMP_NUM_THREADS={threads} lrc_launch {resources.gpu} {resources.accelerate} warmstart --teacher {input.teacher} --bases {input.bases}"
        " --data {input.data} --student-hidden {params.hidden} --out {output}"
        " --ckpt-dir $(ckpt_dir {output} {params.flags:q} {input}) {params.flags} > {log} 2>&1"
