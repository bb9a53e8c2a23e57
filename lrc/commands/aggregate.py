"""`lrc aggregate`: one results table from evaluation JSONs or audit CSVs (:mod:`lrc.analysis.tables`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from lrc.analysis.run_settings import check_settings
from lrc.analysis.tables import audit_table, load_evaluations, results_table, write_csv
from lrc.errors import LRCError
from lrc.options import parse_args


@dataclass(kw_only=True)
class AggregateArgs:
    """Build one results table from evaluation JSONs (table1, sft, controls) or audit CSVs (audit)."""

    table: Literal["table1", "sft", "controls", "audit"] = field(
        metadata={"help": "table1: distilled students before SFT; sft: after SFT; controls: every arm incl. "
                          "confined/randcomp; audit: concatenated audit CSVs"}
    )
    inputs: list[Path] = field(metadata={
        "help": "results/{exp}/eval/*.json files (audit: results/{exp}/audit.csv files)"})
    out: Path = field(metadata={"help": "CSV file to write", "output": "file"})
    expect_settings: str | None = field(default=None, metadata={
        "help": "JSON experiment -> recipe -> {config key: value}: refuse students whose distill settings.json "
                "records another value (the workflow's table rules pass their config's flags)"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(AggregateArgs, argv, prog="lrc aggregate")
    if not args.inputs:
        raise LRCError("--inputs: no files given")
    if args.table == "audit":
        frame = audit_table(args.inputs)
    else:
        records = load_evaluations(args.inputs)
        if args.expect_settings is not None:
            check_settings(records, args.expect_settings)
        frame = results_table(records, sft=(args.table == "sft"))
    write_csv(frame, args.out)
    print(frame.to_string(index=False))
    return 0
