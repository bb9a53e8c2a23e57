# A trained LRC state -> a plain HF checkpoint, verified against the training-time student.


rule merge:
    input:
        teacher="results/{exp}/teacher",
        bases="results/{exp}/svd",
        state=f"results/{{exp}}/distill/{RUN}",
        data="results/{exp}/data/corpus",
    output:
        directory(f"results/{{exp}}/merged/{RUN}"),
    params:
        flags=flags_of("merge"),
    log:
        f"logs/{{exp}}/merge/{RUN}.log",
    benchmark:
        f"benchmarks/{{exp}}/merge/{RUN}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("merge", "threads")
    resources:
        mem_mb=resource("merge", "mem_mb"),
        runtime=resource("merge", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc merge --teacher {input.teacher} --bases {input.bases}"
        " --state {input.state} --data {input.data}/valid --out {output} {params.flags} > {log} 2>&1"
