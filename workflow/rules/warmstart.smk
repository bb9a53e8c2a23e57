# The warm start (slice arm) that every arm of a recipe continues from: one per recipe, since
# the kl recipe's 2x2 starts from its own KL-only run, not from the lrc one.


rule warmstart:
    input:
        teacher="results/{exp}/teacher",
        bases="results/{exp}/svd",
        data="results/{exp}/data/corpus",
    output:
        directory("results/{exp}/warmstart/{recipe}"),
    params:
        hidden=student_hidden,
        flags=flags_of("warmstart"),
    log:
        "logs/{exp}/warmstart/{recipe}.log",
    benchmark:
        "benchmarks/{exp}/warmstart/{recipe}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("warmstart", "threads")
    resources:
        gpu=resource("warmstart", "gpu"),
        mem_mb=resource("warmstart", "mem_mb"),
        runtime=resource("warmstart", "runtime"),
        accelerate=resource("warmstart", "accelerate"),
    shell:
        "OMP_NUM_THREADS={threads} lrc_launch {resources.gpu} {resources.accelerate:q} warmstart --teacher {input.teacher} --bases {input.bases}"
        " --data {input.data} --recipe {wildcards.recipe} --student-hidden {params.hidden} --out {output}"
        " --ckpt-dir $(ckpt_dir {output} {params:q} -- {input}) {params.flags} > {log} 2>&1"
