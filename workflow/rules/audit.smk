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
