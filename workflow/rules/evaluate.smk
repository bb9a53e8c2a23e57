# One evaluation JSON per model: the teacher, each merged student ({run}) and each SFT student
# ({run}.sft). The tiny world's tasks come with the world. Any other teacher takes the config's
# `evaluate.suite`: paper (the hub's datasets), none (held-out perplexity and KL to the teacher
# only; offline), or local: the lm-eval tasks in `evaluate.tasks_dir`, or, without one, the
# multiple-choice tasks `lrc tasks` builds from the held-out corpus split (offline; see
# builds_tasks in common.smk); or lm-eval: any task lm-eval knows (`evaluate.tasks`, with
# `evaluate.include_path` for task directories of your own). Beside each JSON, {name}.lm_eval/ keeps
# lm-eval's own results and per-document logs (`lrc compare` pairs two models on them). A suite
# from the hub has its datasets fetched first, where Snakemake runs (fetch_tasks, a local rule), so
# evaluation jobs on offline compute nodes read them from the cache (set HF_DATASETS_OFFLINE=1 there).


rule heldout_tasks:
    input:
        data="results/{exp}/data/corpus",
        teacher="results/{exp}/teacher",
    output:
        directory("results/{exp}/tasks"),
    params:
        flags=flags_of("heldout_tasks"),
    log:
        "logs/{exp}/tasks.log",
    benchmark:
        "benchmarks/{exp}/tasks.tsv"
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc tasks --data {input.data}/valid --tokenizer {input.teacher} --out {output} {params.flags} > {log} 2>&1"


rule fetch_tasks:
    output:
        "results/{exp}/eval_tasks.json",
    params:
        flags=fetch_tasks_flags,
    log:
        "logs/{exp}/fetch_tasks.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc fetch-tasks {params.flags} --out {output} > {log} 2>&1"


rule evaluate:
    input:
        unpack(eval_inputs),
    output:
        summary="results/{exp}/eval/{name}.json",
        records=directory("results/{exp}/eval/{name}.lm_eval"),  # lm-eval's own results and per-document logs
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
        " --heldout {input.data}/valid {params.tasks} --out {output.summary} --lm-eval-out {output.records} {params.flags}"
        " > {log} 2>&1"
