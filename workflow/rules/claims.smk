# Every claim of docs/method.md §4 in miniature, with seeds: one table per claim
# (results/claims/{claim}.csv, mean, 95 % CI, per-seed values, paired gains), the saturation
# figure, and the summary results/claims.csv / results/claims.md (`snakemake --cores 2
# results/claims.md`). Which runs each claim reads: lrc.workflow.claims (config: `claims`).


rule claim_capacity:
    input:
        claim_inputs("capacity"),
    output:
        report("results/claims/capacity.csv", caption="../report/claim_capacity.rst", category="Claims"),
    log:
        "logs/claims/capacity.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims capacity --inputs {input} --out {output} > {log} 2>&1"


rule claim_table1:
    input:
        claim_inputs("table1"),
    output:
        report("results/claims/table1.csv", caption="../report/claim_table1.rst", category="Claims"),
    params:
        expect=expected_settings,
    log:
        "logs/claims/table1.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims table1 --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule claim_controls:
    input:
        claim_inputs("controls"),
    output:
        report("results/claims/controls.csv", caption="../report/claim_controls.rst", category="Claims"),
    params:
        expect=expected_settings,
    log:
        "logs/claims/controls.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims controls --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule claim_cross_recipe:
    input:
        claim_inputs("cross_recipe"),
    output:
        report("results/claims/cross_recipe.csv", caption="../report/claim_cross_recipe.rst", category="Claims"),
    params:
        expect=expected_settings,
    log:
        "logs/claims/cross_recipe.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims cross_recipe --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule claim_saturation:
    input:
        claim_inputs("saturation"),
    output:
        csv=report("results/claims/saturation.csv", caption="../report/claim_saturation.rst", category="Claims"),
        png=report("results/claims/saturation.png", caption="../report/claim_saturation_figure.rst", category="Figures"),
        pdf="results/claims/saturation.pdf",
    params:
        expect=expected_settings,
    log:
        "logs/claims/saturation.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims saturation --inputs {input} --expect-settings {params.expect} --out {output.csv}"
        " --figure {output.png} {output.pdf} > {log} 2>&1"


rule claim_knockout:
    input:
        claim_inputs("knockout"),
    output:
        report("results/claims/knockout.csv", caption="../report/claim_knockout.rst", category="Claims"),
    params:
        expect=expected_settings,
    log:
        "logs/claims/knockout.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims knockout --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule claim_sft:
    input:
        claim_inputs("sft"),
    output:
        report("results/claims/sft.csv", caption="../report/claim_sft.rst", category="Claims"),
    params:
        expect=expected_settings,
    log:
        "logs/claims/sft.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims sft --inputs {input} --expect-settings {params.expect} --out {output} > {log} 2>&1"


rule claim_coordinates:
    input:
        claim_inputs("coordinates"),
    output:
        report("results/claims/coordinates.csv", caption="../report/claim_coordinates.rst", category="Claims"),
    params:
        files=update_energy_files,
    log:
        "logs/claims/coordinates.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims coordinates --inputs {params.files} --out {output} > {log} 2>&1"


rule claims:
    input:
        claims_summary_inputs,
    output:
        csv=report("results/claims.csv", caption="../report/claims.rst", category="Claims"),
        md=report("results/claims.md", caption="../report/claims.rst", category="Claims"),
    log:
        "logs/claims/summary.log",
    conda:
        "../envs/lrc.yaml"
    shell:
        "lrc claims summary --inputs {input} --out {output.csv} --markdown {output.md} > {log} 2>&1"
