# Sourced before every rule's shell command (see shell.prefix in workflow/rules/common.smk).

# `lrc` runs the package of this checkout, also inside a bare conda env from workflow/envs/,
# so the code that ran is the code whose revision settings.json records.
export PYTHONPATH="$LRC_REPO${PYTHONPATH:+:$PYTHONPATH}"
lrc() { python -m lrc.cli "$@"; }

# lrc_launch N ACCELERATE_CONFIG COMMAND ARGS...: one process, or `accelerate launch` with that
# config (config/accelerate/: ddp.yaml, fsdp.yaml) across the job's N GPUs. A relative config
# path not found in the working directory is looked up in the checkout.
lrc_launch() {
    local n=$1 accelerate_config=$2
    shift 2
    if [ ! -e "$accelerate_config" ] && [ -e "$LRC_REPO/$accelerate_config" ]; then
        accelerate_config="$LRC_REPO/$accelerate_config"
    fi
    if [ "$n" -gt 0 ]; then
        accelerate launch --config_file "$accelerate_config" --num_processes "$n" -m lrc.cli "$@"
    else
        lrc "$@"
    fi
}

# ckpt_dir OUTPUT PARAM... -- INPUT...: the job's checkpoint directory, checkpoints/<OUTPUT
# without results/>/<key>. It lies outside every declared output, so a failed job keeps it and
# a restart resumes from it. The key hashes every param of the job (its flags and any setting
# the rule passes through params, such as the student width; the wildcards are in OUTPUT) and
# the content of its inputs: every file but the records that differ between two identical
# builds (settings.json with its timestamps, metrics, stamps: lrc/workflow/ckpt_key.py). A
# changed config or an input whose bytes changed therefore starts afresh instead of resuming a
# checkpoint of other settings or shapes; an input rebuilt byte for byte resumes.
ckpt_dir() {
    python -m lrc.workflow.ckpt_key "$@"
}
