"""`lrc curves`: training curves of runs from their metrics.jsonl (:mod:`lrc.analysis.curves`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from lrc.analysis.curves import DEFAULT_TERMS, draw_curves, read_metrics, run_label
from lrc.analysis.figures import save
from lrc.options import parse_args


@dataclass(kw_only=True)
class CurvesArgs:
    """Plot logged terms (loss, CE, KL, clone terms, grad norm, ...) against tokens, one line per run."""

    runs: list[Path] = field(metadata={
        "help": "training output directories (results/{exp}/distill/<run>, warmstart/<recipe>, sft/<run>) or "
                "metrics.jsonl files"})
    out: list[Path] = field(metadata={
        "help": "image files to write; the suffix picks the format (.png, .pdf, .svg)", "output": "file"})
    terms: list[str] = field(default_factory=lambda: list(DEFAULT_TERMS), metadata={
        "help": "logged keys to plot, one panel each (e.g. loss ce kl mlp_out grad_norm lr)"})
    dpi: int = field(default=150, metadata={"help": "resolution of raster formats"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(CurvesArgs, argv, prog="lrc curves")
    runs = {run_label(path): read_metrics(path) for path in args.runs}
    figure = draw_curves(runs, tuple(args.terms))
    for path in args.out:
        save(figure, Path(path), args.dpi)
    print(f"{len(runs)} runs, {', '.join(args.terms)} -> {', '.join(map(str, args.out))}")
    return 0
