# Full fine-tune of a merged student on the chat set.


rule sft:
    input:
        model=f"results/{{exp}}/merged/{RUN}",
        data="results/{exp}/data/sft",
    output:
        directory(f"results/{{exp}}/sft/{RUN}"),
    params:
        flags=section("sft", "train"),
    log:
        f"logs/{{exp}}/sft/{RUN}.log",
    benchmark:
        f"benchmarks/{{exp}}/sft/{RUN}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: res("sft", "threads")
    resources:
        gpu=res("sft", "gpu"),
        mem_mb=res("sft", "mem_mb"),
        runtime=res("sft", "runtime"),
        accelerate=res("sft", "accelerate"),
    shell:
        "OMP_NUM_THREADS={threads} lrc_launch {resources.gpu} {resources.accelerate} sft --model {input.model} --data {input.data}"
        " --out {output} --ckpt-dir $(ckpt_dir {output} {params.flags:q} {input}) {params.flags} > {log} 2>&1"
