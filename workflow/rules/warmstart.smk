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


# claims.vary_warmstart: one warm start per recipe and seed, so the seed varies the warm start
# too (its data order and the factors' initialisation); the distill rule then continues from it.
rule warmstart_seeded:
    input:
        teacher="results/{exp}/teacher",
        bases="results/{exp}/svd",
        data="results/{exp}/data/corpus",
    output:
        directory("results/{exp}/warmstart/{recipe}-s{seed}"),
    params:
        hidden=student_hidden,
        flags=flags_of("warmstart_seeded"),
    log:
        "logs/{exp}/warmstart/{recipe}-s{seed}.log",
    benchmark:
        "benchmarks/{exp}/warmstart/{recipe}-s{seed}.tsv"
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
        " --data {input.data} --recipe {wildcards.recipe} --seed {wildcards.seed} --student-hidden {params.hidden} --out {output}"
        " --ckpt-dir $(ckpt_dir {output} {params:q} -- {input}) {params.flags} > {log} 2>&1"
