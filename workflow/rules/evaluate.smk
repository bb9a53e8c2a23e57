# One evaluation JSON per model: the teacher, each merged student ({run}) and each SFT student
# ({run}.sft). The tiny world's tasks come with the world; a hub teacher uses the paper suite.

rule evaluate:
    input:
        unpack(eval_inputs),
    output:
        "results/{exp}/eval/{name}.json",
    wildcard_constraints:
        name=EVAL_NAME,
    params:
        tasks=eval_tasks,
        flags=flags_of("evaluate"),
    log:
        "logs/{exp}/evaluate/{name}.log",
    benchmark:
        "benchmarks/{exp}/evaluate/{name}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("evaluate", "threads")
    resources:
        gpu=resource("evaluate", "gpu"),
        mem_mb=resource("evaluate", "mem_mb"),
        runtime=resource("evaluate", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc evaluate --model {input.model} --teacher {input.teacher}"
        " --heldout {input.data}/valid {params.tasks} --out {output} {params.flags} > {log} 2>&1"
