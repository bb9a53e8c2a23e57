# The tiny world's teacher, pretrained here from the world's model config.


rule pretrain:
    input:
        world="results/{exp}/world",
        corpus="results/{exp}/data/corpus",
    output:
        directory("results/{exp}/teacher"),
    wildcard_constraints:
        exp=exp_pattern(hub=False),
    params:
        flags=flags_of("pretrain"),
    log:
        "logs/{exp}/pretrain.log",
    benchmark:
        "benchmarks/{exp}/pretrain.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("pretrain", "threads")
    resources:
        gpu=resource("pretrain", "gpu"),
        mem_mb=resource("pretrain", "mem_mb"),
        runtime=resource("pretrain", "runtime"),
        accelerate=resource("pretrain", "accelerate"),
    shell:
        "OMP_NUM_THREADS={threads} lrc_launch {resources.gpu} {resources.accelerate:q} pretrain --model-config {input.world}/teacher_config.json"
        " --tokenizer {input.world}/tokenizer --data {input.corpus} --out {output}"
        " --ckpt-dir $(ckpt_dir {output} {params:q} -- {input}) {params.flags} > {log} 2>&1"
