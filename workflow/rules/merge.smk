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
        flags=section("merge"),
    log:
        f"logs/{{exp}}/merge/{RUN}.log",
    benchmark:
        f"benchmarks/{{exp}}/merge/{RUN}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: res("merge", "threads")
    resources:
        mem_mb=res("merge", "mem_mb"),
        runtime=res("merge", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc merge --teacher {input.teacher} --bases {input.bases}"
        " --state {input.state} --data {input.data}/valid --out {output} {params.flags} > {log} 2>&1"
