# Results tables, the token-efficiency figure, and their entries in `snakemake --report`. results/<table>.csv
# holds every experiment of the config; results/{exp}/<table>.csv one experiment's, kept apart from other configs'.


rule table1:
    input:
        table1_inputs,
    output:
        report("results/table1.csv", caption="../report/table1.rst", category="Tables"),
    params:
        expect=expected_settings,
    log:
        "logs/aggregate/table1.log",
    benchmark:
        "benchmarks/aggregate/table1.tsv"
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc aggregate --table table1 --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule table_sft:
    input:
        sft_inputs,
    output:
        report("results/table_sft.csv", caption="../report/table_sft.rst", category="Tables"),
    params:
        expect=expected_settings,
    log:
        "logs/aggregate/table_sft.log",
    benchmark:
        "benchmarks/aggregate/table_sft.tsv"
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc aggregate --table sft --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule controls:
    input:
        controls_inputs,
    output:
        report("results/controls.csv", caption="../report/controls.rst", category="Tables"),
    params:
        expect=expected_settings,
    log:
        "logs/aggregate/controls.log",
    benchmark:
        "benchmarks/aggregate/controls.tsv"
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc aggregate --table controls --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule experiment_table:
    input:
        lambda wildcards: EXPERIMENT_TABLES[wildcards.table][0](wildcards),
    output:
        "results/{exp}/{table}.csv",
    wildcard_constraints:
        exp="|".join(re.escape(e) for e in EXPS),
        table="|".join(EXPERIMENT_TABLES),
    params:
        kind=lambda wildcards: EXPERIMENT_TABLES[wildcards.table][1],
        expect=expected_settings,
    log:
        "logs/{exp}/aggregate/{table}.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc aggregate --table {params.kind} --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule audit_table:
    input:
        expand("results/{exp}/audit.csv", exp=EXPS),
    output:
        report("results/audit.csv", caption="../report/audit.rst", category="Tables"),
    log:
        "logs/aggregate/audit.log",
    benchmark:
        "benchmarks/aggregate/audit.tsv"
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc aggregate --table audit --inputs {input} --out {output} > {log} 2>&1"


rule token_efficiency:
    input:
        "results/table1.csv",
    output:
        png=report("results/token_efficiency.png", caption="../report/token_efficiency.rst", category="Figures"),
        pdf="results/token_efficiency.pdf",
    log:
        "logs/aggregate/token_efficiency.log",
    benchmark:
        "benchmarks/aggregate/token_efficiency.tsv"
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc figure --table {input} --out {output.png} {output.pdf} > {log} 2>&1"


rule curves:
    input:
        lambda wildcards: expand("results/{exp}/distill/{run}", exp=wildcards.exp, run=runs(wildcards.exp)),
    output:
        "results/{exp}/curves.png",
    log:
        "logs/{exp}/curves.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc curves --runs {input} --out {output} > {log} 2>&1"
