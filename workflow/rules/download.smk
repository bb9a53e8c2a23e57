# The teacher directory of a hub teacher at a pinned revision (safetensors, config, tokenizer),
# or of a local one: a Hugging Face directory or a GGUF file, dequantised (no network).


rule download:
    output:
        directory("results/{exp}/teacher"),
    wildcard_constraints:
        exp=exp_pattern(hub=True),
    params:
        flags=flags_of("download"),
    log:
        "logs/{exp}/download.log",
    benchmark:
        "benchmarks/{exp}/download.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("download", "threads")
    resources:
        mem_mb=resource("download", "mem_mb"),
        runtime=resource("download", "runtime"),
    shell:
        "lrc download --out {output} {params.flags} > {log} 2>&1"


rule import_teacher:
    input:
        unpack(local_teacher_input),
    output:
        directory("results/{exp}/teacher"),
    wildcard_constraints:
        exp=exp_pattern(sources=("local", "gguf")),
    params:
        flags=flags_of("import_teacher"),
    log:
        "logs/{exp}/import_teacher.log",
    benchmark:
        "benchmarks/{exp}/import_teacher.tsv"
    conda:
        "../envs/lrc.yaml"
    threads: resource("import_teacher", "threads")
    resources:
        mem_mb=resource("import_teacher", "mem_mb"),
        runtime=resource("import_teacher", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} lrc import-teacher --out {output} {params.flags} > {log} 2>&1"
