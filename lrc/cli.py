"""The `lrc` command line: one sub-command per workflow stage.

Each sub-command lives in its own module, which exposes ``main(argv) -> int`` and
describes its arguments as a keyword-only dataclass (see :func:`lrc.options.parse_args`). The
table below is the only place that knows all commands; modules are imported lazily
so `lrc --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from lrc.errors import LRCError

COMMANDS: dict[str, tuple[str, str]] = {
    "world": ("lrc.commands.world", "generate the built-in tiny world (corpus, tokenizer, tasks, teacher config)"),
    "download": ("lrc.commands.download", "download a teacher from the Hugging Face hub (pinned revision)"),
    "import-teacher": ("lrc.commands.import_teacher",
                       "import a local teacher (HF directory or GGUF file, dequantised) offline"),
    "tokenize": ("lrc.commands.tokenize", "tokenise a corpus or chat set into a memory-mapped token file"),
    "pretrain": ("lrc.commands.pretrain", "pretrain a plain model from a config (the tiny-world teacher)"),
    "svd": ("lrc.commands.svd", "compute the teacher's MLP singular bases once"),
    "warmstart": ("lrc.commands.distill", "plain LRC warm start (slice arm, `lrc` recipe)"),
    "distill": ("lrc.commands.distill", "distill one arm from the warm start"),
    "merge": ("lrc.commands.merge", "materialise a trained student into a plain HF checkpoint, verified"),
    "upload": ("lrc.commands.upload", "upload a merged student (model card, licence files) to the Hugging Face hub"),
    "sft": ("lrc.commands.sft", "supervised fine-tuning of a merged checkpoint on chat data"),
    "tasks": ("lrc.commands.tasks", "multiple-choice lm-eval tasks from held-out documents (offline)"),
    "fetch-tasks": ("lrc.commands.fetch_tasks",
                    "load the evaluation tasks' datasets into the cache ahead of the run (offline compute nodes)"),
    "evaluate": ("lrc.commands.evaluate",
                 "lm-eval suite (or none) plus held-out perplexity, KL to teacher, answer log-prob"),
    "compare": ("lrc.commands.compare", "two evaluated models on the same lm-eval items: B − A per task, paired CI"),
    "probe": ("lrc.commands.probe", "capacity probe: per teacher MLP, the error of a width-r slice vs a free MLP"),
    "audit": ("lrc.commands.audit", "reachability audit: reachable dimensions per weight, occupancy, knockout"),
    "recover": ("lrc.commands.recover", "recover LRC factors from a merged LRC student (least squares)"),
    "aggregate": ("lrc.commands.aggregate", "build the results tables from evaluation JSONs"),
    "figure": ("lrc.commands.figure", "draw the token-efficiency figure"),
    "curves": ("lrc.commands.curves", "training curves (loss terms against tokens) of runs from their metrics.jsonl"),
    "claims": ("lrc.commands.claims",
               "one claim of the paper in miniature (CIs over seeds, paired tests), or their summary"),
    "bench": ("lrc.commands.bench", "median step time and peak memory per arm vs plain KD"),
    "plan": ("lrc.commands.plan",
             "predicted peak memory per GPU of each arm (a traced step) and the largest micro-batch that fits"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _print_usage()
        return 0
    if argv[0] == "--version":
        from lrc import __version__

        print(__version__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        _print_usage(sys.stderr)
        print(f"error: unknown command {command!r}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    try:
        # Modules serving several commands dispatch on the command name.
        entry = getattr(module, f"main_{command}", None) or module.main
        code = int(entry(rest) or 0)
    except LRCError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    end_process_group()
    return code


def end_process_group() -> None:
    """End a finished command's process group (an `accelerate launch` run) while the interpreter
    is whole. Left to the interpreter's exit, gloo's worker threads can abort the process
    (SIGABRT, "terminate called without an active exception") after its outputs are written,
    and Snakemake or SLURM then count the job as failed. Not after an error: a process that
    raised may leave the others inside a collective, where destroying the group can hang."""
    dist = sys.modules.get("torch.distributed")  # never imported here: `lrc --help` stays fast
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _print_usage(stream=sys.stdout) -> None:
    print("usage: lrc <command> [--help] [--config FILE.yaml] [--option value ...]\n", file=stream)
    print("commands:", file=stream)
    for name, (_, summary) in COMMANDS.items():
        print(f"  {name:<10} {summary}", file=stream)


if __name__ == "__main__":
    raise SystemExit(main())
