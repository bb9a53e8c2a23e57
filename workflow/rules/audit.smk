# The reachability audit of the deployed student shape: reachable dimensions per weight and arm.


rule audit:
    input:
        teacher="results/{exp}/teacher",
    output:
        "results/{exp}/audit.csv",
    params:
        hidden=student_hidden,
        flags=flags_of("audit"),
    log:
        "logs/{exp}/audit.log",
    benchmark:
        "benchmarks/{exp}/audit.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("audit", "threads")
    resources:
        mem_mb=resource("audit", "mem_mb"),
        runtime=resource("audit", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc audit {input.teacher} --student-hidden {params.hidden}"
        " --csv {output} {params.flags} > {log} 2>&1"


# The capacity probe: per teacher MLP, the top-r energy of its inputs and what a width-r slice
# vs a free MLP reaches of its map on the corpus (docs/method.md §10). Its own target.
rule probe:
    input:
        teacher="results/{exp}/teacher",
        data="results/{exp}/data/corpus",
    output:
        "results/{exp}/probe.csv",
    params:
        hidden=student_hidden,
        flags=flags_of("probe"),
    log:
        "logs/{exp}/probe.log",
    benchmark:
        "benchmarks/{exp}/probe.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("probe", "threads")
    resources:
        mem_mb=resource("probe", "mem_mb"),
        runtime=resource("probe", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc probe --teacher {input.teacher} --data {input.data}"
        " --student-hidden {params.hidden} --out {output} {params.flags} > {log} 2>&1"


# The claims' knockout (claims.smk): the energy of a merged full-reach student's MLP outside the
# teacher's column/row spaces per layer and weight, and the student with that part removed
# (evaluated as {run}.knockout by the evaluate rule).
rule knockout_audit:
    input:
        teacher="results/{exp}/teacher",
        student=f"results/{{exp}}/merged/{RUN}",
        bases="results/{exp}/svd",
    output:
        occupancy=f"results/{{exp}}/occupancy/{RUN}.csv",
        knockout=directory(f"results/{{exp}}/knockout/{RUN}"),
    params:
        hidden=student_hidden,
        flags=flags_of("knockout_audit"),
    log:
        f"logs/{{exp}}/knockout/{RUN}.log",
    benchmark:
        f"benchmarks/{{exp}}/knockout/{RUN}.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("audit", "threads")
    resources:
        mem_mb=resource("audit", "mem_mb"),
        runtime=resource("audit", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc audit {input.teacher} --student-hidden {params.hidden} --student {input.student}"
        " --bases {input.bases} --knockout {output.knockout} --occupancy-csv {output.occupancy} {params.flags} > {log} 2>&1"
