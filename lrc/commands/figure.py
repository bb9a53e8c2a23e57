"""`lrc figure`: the token-efficiency figure from a results table (:mod:`lrc.analysis.figures`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from lrc.analysis.figures import draw, save
from lrc.analysis.tables import read_csv_table
from lrc.errors import LRCError
from lrc.options import parse_args


@dataclass(kw_only=True)
class FigureArgs:
    """Draw aggregate score against distillation tokens (log scale), one panel per experiment."""

    table: Path = field(metadata={"help": "results table CSV written by `lrc aggregate` (table1 or controls)"})
    out: list[Path] = field(metadata={
        "help": "image files to write; the suffix picks the format (.png, .pdf, .svg)", "output": "file"})
    dpi: int = field(default=150, metadata={"help": "resolution of raster formats"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(FigureArgs, argv, prog="lrc figure")
    if not args.out:
        raise LRCError("--out: no image file given")
    table = read_csv_table(args.table, "results table", ("experiment", "arm", "recipe", "tokens", "aggregate"))
    figure = draw(table)
    for path in args.out:
        save(figure, Path(path), args.dpi)
    return 0
