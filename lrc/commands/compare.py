"""`lrc compare`: two evaluated models on the same lm-eval items and held-out rows
(:mod:`lrc.analysis.paired_items`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Sequence

import pandas as pd

from lrc.analysis.paired_items import compare_table, heldout_table
from lrc.analysis.stats import LEVEL
from lrc.analysis.tables import write_csv
from lrc.errors import LRCError
from lrc.io.lm_eval_records import summary_records
from lrc.options import parse_args


@dataclass(kw_only=True)
class CompareArgs:
    """Compare two `lrc evaluate` results item by item: per task, B − A with its paired interval; per
    held-out measure (cross-entropy, KL to the teacher, top-1 agreement), B − A over the same rows."""

    a: Path = field(metadata={"help": "summary JSON of `lrc evaluate` for model A", "positional": True})
    b: Path = field(metadata={"help": "summary JSON of `lrc evaluate` for model B", "positional": True})
    out: Path | None = field(default=None, metadata={"help": "CSV file to write (default: print only)",
                                                     "output": "file"})
    level: float = field(default=LEVEL, metadata={"help": "confidence level of the interval"})

    def __post_init__(self) -> None:
        if not 0 < self.level < 1:
            raise LRCError(f"--level must lie in (0, 1), got {self.level}")


class Evaluation(NamedTuple):
    """What `lrc compare` reads of an `lrc evaluate` summary."""

    name: str
    records: Path  # its lm-eval records directory
    tasks: dict
    heldout_rows: dict | None  # each held-out row's sums, where the evaluation measured them


def evaluation(path: Path) -> Evaluation:
    """The model name, lm-eval records directory, tasks and held-out rows of an `lrc evaluate` summary."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise LRCError(f"{path}: not an `lrc evaluate` summary JSON ({err})") from err
    if not isinstance(summary, dict) or "tasks" not in summary:
        raise LRCError(f"{path}: not an `lrc evaluate` summary JSON (no `tasks`)")
    records = summary_records(path, summary)
    if summary["tasks"] and not records.is_dir():
        raise LRCError(f"{path}: its lm-eval records {records} are missing (evaluations before lrc kept them "
                       "must be run again)")
    heldout = (summary.get("extra") or {}).get("heldout_rows")
    return Evaluation(str(summary.get("model") or path.stem), records, summary["tasks"], heldout)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(CompareArgs, argv, prog="lrc compare")
    a, b = evaluation(args.a), evaluation(args.b)
    if a.name == b.name:
        a, b = a._replace(name=str(args.a)), b._replace(name=str(args.b))
    table = pd.concat([compare_table((a.name, a.records, a.tasks), (b.name, b.records, b.tasks), args.level),
                       heldout_table((a.name, a.heldout_rows), (b.name, b.heldout_rows), args.level)],
                      ignore_index=True)
    if table.empty:
        raise LRCError(f"{a.name} and {b.name} share no task scored with the same metric and no held-out rows "
                       f"(tasks {sorted(a.tasks)} vs {sorted(b.tasks)})")
    if args.out is not None:
        write_csv(table, args.out)
    print(f"A = {a.name}, B = {b.name}; {args.level:.0%} paired interval over items")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0
