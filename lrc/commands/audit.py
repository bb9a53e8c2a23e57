"""`lrc audit`: the reachability audit: what each arm can reach of every deployed weight.

For a teacher (a ``config.json`` or a checkpoint directory) and a student width r, one row
per deployed weight type (METHOD.md §2): its student shape, the deployed degrees of
freedom, the dimension of the set training can reach under each arm, the training
utilisation ``u = reachable / deployed`` of plain LRC and its stranded fraction ``1 − u``.
A weight ``W = T·Zᵀ`` with T frozen and rank(T) = k reaches k·r of its entries' d·r
dimensions (k = min(out, H) for q/k/v, and likewise for o; H for gate/up/down; H for the
embedding and head, u = H/V). Only gate/up/down change with the arm: dense, core and
randcomp reach all d_ff·r, slice and confined H·r.

With ``--student MERGED_DIR`` (and a teacher *directory*) it measures occupancy: the
fraction of each MLP weight's energy (squared Frobenius norm) outside the teacher
weight's column space (gate/up) or row space (down), ``‖W − U Uᵀ W‖² / ‖W‖²`` with U from
the teacher's SVD (:mod:`lrc.method.spectral`), per layer on stderr and, with ``--occupancy-csv
PATH``, as CSV (:data:`OCCUPANCY_COLUMNS`). With ``--knockout OUT_DIR`` it also writes a
loadable copy of the student with exactly that part projected away.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lrc.errors import LRCError
from lrc.io.atomic import atomic_dir, atomic_file
from lrc.io.hf import load_causal_lm, load_teacher, save_causal_lm, tokenizer_if_any
from lrc.io.provenance import write_settings
from lrc.method.reachability import (
    OCCUPANCY_COLUMNS,
    knockout,
    mlp_stranded_fraction,
    occupancy,
    reachability_table,
    read_teacher_config,
)
from lrc.method.spectral import load_bases
from lrc.names import ARMS
from lrc.options import parse_args


def write_occupancy_csv(per_layer: list[dict], path: Path) -> None:
    """The rows of :func:`occupancy` as CSV (atomic: a failed run leaves no partial file)."""
    with atomic_file(path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=OCCUPANCY_COLUMNS)
        writer.writeheader()
        writer.writerows({c: r[c] for c in OCCUPANCY_COLUMNS} for r in per_layer)


def format_table(rows: list[dict]) -> str:
    cols = ["weight", "count", "shape", "deployed", *[f"reach_{a}" for a in ARMS], "u", "stranded"]
    if any("occupancy" in r for r in rows):
        cols.append("occupancy")

    def cell(row, c):
        v = row.get(c, "")
        if c in ("u", "stranded", "occupancy") and v != "":
            return f"{100 * v:.1f}%"
        return str(v)

    table = [cols] + [[cell(r, c) for c in cols] for r in rows]
    widths = [max(len(line[j]) for line in table) for j in range(len(cols))]
    return "\n".join("  ".join(x.rjust(w) if j else x.ljust(w) for j, (x, w) in enumerate(zip(line, widths)))
                     for line in table)


@dataclass(kw_only=True)
class AuditArgs:
    """Reachability audit: reachable dimensions per weight and arm, occupancy, knockout."""

    teacher: Path = field(metadata={"help": "teacher config.json or checkpoint directory", "positional": True})
    student_hidden: int = field(metadata={"help": "student hidden size r"})
    csv: Path | None = field(default=None, metadata={"help": "also write the table as CSV here", "output": "file"})
    student: Path | None = field(default=None, metadata={
        "help": "merged student checkpoint: measure MLP occupancy outside the teacher's spaces"})
    bases: Path | None = field(default=None, metadata={
        "help": "teacher bases directory (computed from the teacher if omitted)"})
    knockout: Path | None = field(default=None, metadata={
        "help": "write a copy of --student with the outside part removed here", "output": "dir"})
    occupancy_csv: Path | None = field(default=None, metadata={
        "help": "write --student's per-layer occupancy here (CSV: " + ",".join(OCCUPANCY_COLUMNS) + ")",
        "output": "file"})
    allow_pickle: bool = field(default=False, metadata={
        "help": "accept teacher/student weights stored as pickles (pytorch_model.bin; can run code when loaded)"})


def main(argv=None) -> int:
    args = parse_args(AuditArgs, argv, prog="lrc audit")
    cfg = read_teacher_config(args.teacher)
    rows = reachability_table(cfg, args.student_hidden)
    for name in ("knockout", "occupancy_csv"):
        if getattr(args, name) is not None and args.student is None:
            raise LRCError(f"--{name.replace('_', '-')} needs --student")
    per_layer = None
    if args.student is not None:
        per_layer = _audit_student(args, cfg, rows)
    print(f"teacher {cfg['model_type']} H={cfg['hidden_size']} d_ff={cfg['intermediate_size']} -> "
          f"r={args.student_hidden}")
    print(format_table(rows))
    print(f"MLP stranded fraction under plain LRC: {100 * mlp_stranded_fraction(cfg, args.student_hidden):.1f}%")
    if per_layer is not None:
        total = sum(r["energy"] for r in per_layer)
        print("student MLP energy outside the teacher's spaces: "
              f"{100 * sum(r['outside'] for r in per_layer) / total:.2f}%")
    if args.csv is not None:
        with atomic_file(args.csv) as tmp, tmp.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0].keys()) + (["occupancy"] if per_layer else []))
            writer.writeheader()
            writer.writerows(rows)
    return 0


def _audit_student(args, cfg, rows) -> list[dict]:
    if not Path(args.teacher).is_dir():
        raise LRCError("--student needs the teacher's weights: give TEACHER as a checkpoint directory, "
                       "not a config file")
    teacher = load_teacher(args.teacher, allow_pickle=args.allow_pickle)
    student = load_causal_lm(args.student, dtype=torch.float32, role="--student", allow_pickle=args.allow_pickle)
    if (student.config.intermediate_size != cfg["intermediate_size"]
            or student.config.num_hidden_layers != cfg["num_hidden_layers"]):
        raise LRCError(f"--student {args.student} does not have the teacher's MLP width and depth")
    bases = load_bases(args.bases, teacher) if args.bases is not None else None
    per_layer = occupancy(teacher, student, bases)
    for row in rows:
        mine = [r for r in per_layer if r["weight"] == row["weight"]]
        if mine:
            row["occupancy"] = sum(r["outside"] for r in mine) / sum(r["energy"] for r in mine)
    for r in per_layer:
        print(f"layer {r['layer']:>3} {r['weight']:<9} occupancy {100 * r['occupancy']:.3f}%", file=sys.stderr)
    if args.occupancy_csv is not None:
        write_occupancy_csv(per_layer, args.occupancy_csv)
    if args.knockout is not None:
        knockout(teacher, student, bases)
        with atomic_dir(args.knockout) as tmp:
            save_causal_lm(student, tmp, tokenizer_if_any(args.student))
            removed = sum(r["outside"] for r in per_layer) / sum(r["energy"] for r in per_layer)
            write_settings(tmp, "audit --knockout", args, removed_mlp_energy_fraction=removed)
    return per_layer
