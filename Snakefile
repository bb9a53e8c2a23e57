# LRC reach: teacher -> SVD -> LRC warm start -> distill {arm} -> merge -> {evaluate, SFT -> evaluate}
# -> tables, figure, report.  Settings live in the config (see workflow/schemas/config.schema.yaml);
# each rule hands one config section to one `lrc` command as flags.

import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from lrc.workflow.config import yaml_syntax_problem

min_version("9.0")


# Without --configfile: the working directory's config/config.yaml (a project laid out as the Snakemake
# catalog's), else the built-in tiny world beside this file, so `snakemake -s <checkout>/Snakefile` runs anywhere.
DEFAULT_CONFIG = next(c for c in ("config/config.yaml", f"{workflow.basedir}/config/config.yaml") if os.path.exists(c))

# A config file's YAML error, a key given twice (YAML keeps the last silently) or non-UTF-8 text,
# named with its file and line (Snakemake's own message names neither; it reads a --configfile
# before this file runs, so only a key given twice reaches here from one).
for config_file in workflow.overwrite_configfiles or [DEFAULT_CONFIG]:
    if problem := yaml_syntax_problem(config_file):
        raise WorkflowError(problem)

# --configfile replaces the built-in tiny world instead of being merged into it, so a paper
# config never inherits stray tiny-world settings; --config key=value still overrides either.
if not workflow.overwrite_configfiles:
    configfile: DEFAULT_CONFIG


include: "workflow/rules/common.smk"
include: "workflow/rules/world.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/tokenize.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/svd.smk"
include: "workflow/rules/warmstart.smk"
include: "workflow/rules/distill.smk"
include: "workflow/rules/merge.smk"
include: "workflow/rules/sft.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/audit.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/claims.smk"


# Jobs of a second or two run where Snakemake runs, never as cluster jobs: the tables, the figure and the
# claims read JSONs. `download` and `fetch_tasks` too: a cluster's compute nodes are often offline, its login node
# is not.
localrules:
    all,
    download,
    fetch_tasks,
    table1,
    table_sft,
    controls,
    experiment_table,
    audit_table,
    token_efficiency,
    curves,
    claims,
    claim_capacity,
    claim_table1,
    claim_controls,
    claim_cross_recipe,
    claim_saturation,
    claim_knockout,
    claim_sft,
    claim_coordinates,


# Only now are all rules defined: check the flag sections against the rules and commands.
check_flag_sections()


rule all:
    input:
        final_targets(),
    default_target: True
