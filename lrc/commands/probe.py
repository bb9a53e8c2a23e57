"""`lrc probe`: does a width-r student leave teacher MLP capacity stranded? (:mod:`lrc.method.capacity`).

Per layer, on calibration tokens: the teacher's MLP-input energy in its top-r directions and the
held-out relative error of the best slice-constrained and of the best free width-r MLP fitted
to the teacher's own MLP map; ``stranded`` is the share of the slice's error the free matrix
removes. A world where the slice's error is near 0, or where ``stranded`` is, has nothing for
dense or core to recover (docs/method.md §10).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lrc.errors import LRCError

from lrc.io.hf import load_teacher
from lrc.io.atomic import atomic_file, write_json_atomic
from lrc.io.provenance import provenance
from lrc.io.tokens import check_vocab, open_token_data
from lrc.method.capacity import PROBE_COLUMNS, decoder_layers, mlp_samples, probe_layer
from lrc.options import parse_args


@dataclass(kw_only=True)
class ProbeArgs:
    """Capacity probe: per layer, top-r MLP-input energy and the slice's vs a free MLP's fitting error."""

    teacher: Path = field(metadata={"help": "teacher checkpoint directory (HF format)"})
    data: Path = field(metadata={"help": "calibration tokens (an `lrc tokenize` directory)"})
    student_hidden: int = field(metadata={"help": "student hidden size r"})
    out: Path = field(metadata={"help": "CSV to write, one row per layer", "output": "file"})
    rows: int = field(default=64, metadata={
        "help": "token rows to sample, evenly spaced; the last quarter of their positions is held out"})
    layers: str = field(default="all", metadata={"help": "layers to probe: all, or comma-separated indices"})
    steps: int = field(default=400, metadata={"help": "full-batch Adam steps per fit (slice, then free)"})
    lr: float = field(default=0.01, metadata={"help": "Adam's peak learning rate (cosine to 0)"})


def chosen_layers(spec: str, count: int) -> list[int]:
    if spec == "all":
        return list(range(count))
    try:
        layers = [int(part) for part in spec.split(",")]
    except ValueError as err:
        raise LRCError(f"--layers {spec!r}: give 'all' or comma-separated layer indices") from err
    bad = [i for i in layers if not 0 <= i < count]
    if bad or len(set(layers)) != len(layers):
        raise LRCError(f"--layers {spec!r}: indices must be distinct and in 0..{count - 1}")
    return layers


def calibration_rows(data, rows: int) -> torch.Tensor:
    if rows < 2:
        raise LRCError(f"--rows {rows}: need at least 2")
    if rows > len(data):
        raise LRCError(f"--rows {rows}: {data.directory} holds only {len(data)} rows")
    picks = torch.linspace(0, len(data) - 1, rows).round().long().tolist()
    return torch.stack([data[i]["input_ids"] for i in picks])


def write_rows(rows: list[dict], path: Path) -> None:
    with atomic_file(path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=PROBE_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None) -> int:
    args = parse_args(ProbeArgs, argv, prog="lrc probe")
    teacher = load_teacher(args.teacher)
    hidden = teacher.config.hidden_size
    if not 1 <= args.student_hidden < hidden:
        raise LRCError(f"--student-hidden {args.student_hidden}: must lie in 1..{hidden - 1} (the teacher's "
                       f"hidden size is {hidden})")
    data = open_token_data(args.data)
    check_vocab(data, teacher)
    layers = chosen_layers(args.layers, len(decoder_layers(teacher)))
    samples = mlp_samples(teacher, calibration_rows(data, args.rows), layers)
    rows = []
    for i in layers:
        x, y = samples.pop(i)
        result = probe_layer(decoder_layers(teacher)[i].mlp, x, y, args.student_hidden, layer=i, steps=args.steps,
                             lr=args.lr)
        rows.append(result.row())
        print(f"layer {i}: top-{args.student_hidden} energy {100 * result.energy:.2f} %, held-out error slice "
              f"{100 * result.slice_error:.3f} % (fitted {100 * result.slice_fit_error:.3f} %), free "
              f"{100 * result.free_error:.3f} % (fitted {100 * result.free_fit_error:.3f} %), stranded "
              f"{100 * result.stranded:.1f} %", flush=True)
        if result.slice_halvings or result.free_halvings:
            print(f"layer {i}: the fits diverged and halved their learning rate {result.slice_halvings} (slice) and "
                  f"{result.free_halvings} (free) times; a lower --lr saves those steps", flush=True)
    write_rows(rows, args.out)
    settings = args.out.with_name(args.out.name + ".settings.json")  # beside the CSV: its folder is shared
    write_json_atomic(settings, provenance("probe", args))
    print(f"probe: wrote {args.out} and {settings.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
