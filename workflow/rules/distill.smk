# One arm, recipe, seed and token budget, continued from the warm start.


rule distill:
    input:
        teacher="results/{exp}/teacher",
        bases="results/{exp}/svd",
        warmstart=warmstart_input,
        data="results/{exp}/data/corpus",
    output:
        directory(f"results/{{exp}}/distill/{RUN}"),
    params:
        flags=flags_of("distill"),
    log:
        f"logs/{{exp}}/distill/{RUN}.log",
    benchmark:
        f"benchmarks/{{exp}}/distill/{RUN}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("distill", "threads")
    resources:
        gpu=resource("distill", "gpu"),
        mem_mb=resource("distill", "mem_mb"),
        runtime=resource("distill", "runtime"),
        accelerate=resource("distill", "accelerate"),
    shell:
        "OMP_NUM_THREADS={threads} lrc_launch {resources.gpu} {resources.accelerate:q} distill --teacher {input.teacher} --bases {input.bases}"
        " --warmstart {input.warmstart} --data {input.data} --arm {wildcards.arm}"
        " --recipe {wildcards.recipe} --seed {wildcards.seed} --tokens {wildcards.tokens}"
        " --out {output} --ckpt-dir $(ckpt_dir {output} {params:q} -- {input}) {params.flags} > {log} 2>&1"
