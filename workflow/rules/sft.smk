# Full fine-tune of a merged student on the chat set.


rule sft:
    input:
        model=f"results/{{exp}}/merged/{RUN}",
        data="results/{exp}/data/sft",
    output:
        directory(f"results/{{exp}}/sft/{RUN}"),
    params:
        flags=flags_of("sft"),
    log:
        f"logs/{{exp}}/sft/{RUN}.log",
    benchmark:
        f"benchmarks/{{exp}}/sft/{RUN}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("sft", "threads")
    resources:
        gpu=resource("sft", "gpu"),
        mem_mb=resource("sft", "mem_mb"),
        runtime=resource("sft", "runtime"),
        accelerate=resource("sft", "accelerate"),
    shell:
        "OMP_NUM_THREADS={threads} lrc_launch {resources.gpu} {resources.accelerate:q} sft --model {input.model} --data {input.data}"
        " --out {output} --ckpt-dir $(ckpt_dir {output} {params:q} -- {input}) {params.flags} > {log} 2>&1"
