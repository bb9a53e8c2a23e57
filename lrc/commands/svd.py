"""`lrc svd`: compute the teacher's MLP singular bases once (the math is :mod:`lrc.method.spectral`).

The bases record the teacher's fingerprint (:func:`lrc.method.spectral.teacher_fingerprint`) and
the teacher directory they were computed from, so that distill, merge and audit refuse
bases of another teacher with the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from lrc.errors import LRCError
from lrc.io.hf import load_teacher
from lrc.io.provenance import write_settings
from lrc.method.spectral import compute_bases, save_bases
from lrc.options import parse_args


@dataclass(kw_only=True)
class SvdArgs:
    """Compute the teacher's MLP singular bases once (float64 SVD, stored float32)."""

    teacher: Path = field(metadata={"help": "teacher checkpoint directory (HF format)"})
    out: Path = field(metadata={"help": "output directory for the bases"})
    device: str = field(default="cpu", metadata={
        "help": "where the float64 SVDs run: cpu (LAPACK, the reference) or cuda (much faster at paper scale)"})
    allow_pickle: bool = field(default=False, metadata={
        "help": "accept a teacher stored as pickled weights (pytorch_model.bin; can run code when loaded)"})


def main(argv=None) -> int:
    args = parse_args(SvdArgs, argv, prog="lrc svd")
    if args.device != "cpu" and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        raise LRCError(f"--device {args.device!r}: use cpu, or cuda on a machine with a GPU")
    teacher = load_teacher(args.teacher, allow_pickle=args.allow_pickle)
    bases = compute_bases(teacher, args.device)
    bases.meta["teacher"] = str(args.teacher)
    save_bases(bases, args.out)
    write_settings(args.out, "svd", args, bases=bases.meta)
    print(f"wrote teacher bases for {len(bases.U)} MLP matrices to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
