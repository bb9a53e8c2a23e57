"""`lrc claims CLAIM`: one claim of the paper (docs/method.md §4) regenerated in miniature.

Each claim is a CSV with one row per comparison (lrc.analysis.claims_rows.ROW_COLUMNS first): the
paper's number and setting, the miniature's mean over seeds, its 95 % Student's t interval,
the per-seed values and the paired p-value. ``summary`` gathers the claim CSVs into
``results/claims.csv`` and (``--markdown``) ``results/claims.md``. The tables live in
lrc.analysis.claims_tables (scores) and lrc.analysis.claims_measures (capacity, knockout, coordinates).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from lrc import names
from lrc.analysis.claims_rows import by_experiment
from lrc.analysis.run_settings import check_settings
from lrc.analysis.tables import load_evaluations
from lrc.errors import LRCError
from lrc.io.atomic import atomic_file
from lrc.options import check_choice, parse_args

CLAIMS = (*names.CLAIMS, "summary")


@dataclass(kw_only=True)
class ClaimsArgs:
    """Build one claim table (or the summary of all of them) with intervals over seeds."""

    claim: str = field(metadata={"help": f"one of {', '.join(CLAIMS)}", "positional": True})
    inputs: list[Path] = field(metadata={
        "help": "evaluation JSONs (knockout: + occupancy CSVs; coordinates: update_energy.csv files; "
                "capacity: probe.csv, one per experiment; summary: claim CSVs)"})
    out: Path = field(metadata={"help": "CSV to write (summary: results/claims.csv)", "output": "file"})
    figure: list[Path] = field(default_factory=list, metadata={
        "help": "saturation only: figure files (.png, .pdf)", "output": "file"})
    markdown: Path | None = field(default=None, metadata={"help": "summary only: results/claims.md", "output": "file"})
    time_file: Path | None = field(default=None, metadata={
        "help": "summary only: a file holding the run's seconds, shown in the markdown"})
    expect_settings: str | None = field(default=None, metadata={
        "help": "JSON experiment -> recipe -> {config key: value}: refuse students whose distill settings.json "
                "records another value (as `lrc aggregate --expect-settings`; the claim rules pass it)"})


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(ClaimsArgs, argv, prog="lrc claims")
    check_choice("claim", args.claim, CLAIMS)
    if not args.inputs:
        raise LRCError("--inputs: no files given")
    if args.figure and args.claim != "saturation":
        raise LRCError(f"--figure: only the saturation claim draws a figure, not {args.claim}")
    if (args.markdown or args.time_file) and args.claim != "summary":
        raise LRCError(f"--markdown/--time-file belong to the summary, not to {args.claim}")
    if args.expect_settings is not None:
        evaluations = [p for p in args.inputs if Path(p).suffix == ".json"]
        check_settings(load_evaluations(evaluations), args.expect_settings)
    if args.claim == "summary":
        frame = _summary(args)
    else:
        frame = build(args.claim, args.inputs)
        if args.figure:
            from lrc.analysis import figures

            fig = figures.draw_saturation(frame)
            for path in args.figure:
                figures.save(fig, Path(path), dpi=150)
    write_claim_csv(frame, args.out)
    columns = ("claim", "comparison", "paper", "miniature", "ci_low", "ci_high", "n_seeds", "p_value")
    print(frame[[c for c in columns if c in frame]].to_string(index=False))
    return 0


def build(claim: str, inputs: Sequence[Path]) -> pd.DataFrame:
    from lrc.analysis import claims_measures, claims_tables

    builders = {
        "table1": claims_tables.table1, "controls": claims_tables.controls, "cross_recipe": claims_tables.cross_recipe,
        "saturation": claims_tables.saturation, "sft": claims_tables.sft,
        "knockout": claims_measures.knockout, "coordinates": claims_measures.coordinates,
        "capacity": claims_measures.capacity,
    }
    # One table per experiment (each claims section of the config), stacked.
    return pd.concat([builders[claim](paths) for paths in by_experiment(inputs).values()], ignore_index=True)


def _summary(args: ClaimsArgs) -> pd.DataFrame:
    from lrc.analysis import claims_summary

    frame, rows = claims_summary.summary(args.inputs)
    if args.markdown:
        seconds = claims_summary.read_seconds(args.time_file) if args.time_file else None
        claims_summary.write_markdown(claims_summary.markdown(rows, seconds=seconds), args.markdown)
    return frame


def write_claim_csv(frame: pd.DataFrame, out: Path) -> Path:
    """Atomically; numbers to 4 decimals, p-values to 4 significant digits (small ones stay visible)."""
    p = frame["p_value"].map(lambda v: "" if pd.isna(v) else f"{float(v):.4g}") if "p_value" in frame else None
    frame = frame.round(4)
    if p is not None:
        frame["p_value"] = p
    with atomic_file(out) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(out)
